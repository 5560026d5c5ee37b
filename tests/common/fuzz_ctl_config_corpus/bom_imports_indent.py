from __future__ import annotations
import os.path, sys as system
from ..pkg import thing as other
from easydict import EasyDict as edict
config = edict()
config.num_classes = 10
  config.lr = 5.0
config = edict()
