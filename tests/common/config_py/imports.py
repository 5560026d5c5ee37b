# Every import form the reader takes: plain, dotted, several, 'as', from-imports.
from __future__ import annotations
import os
import os.path, sys as system
from os import path as osp, sep
from easydict import EasyDict as edict
from easydict import EasyDict

config = edict()
config.network = "mbf"
config.embedding_size = 256
config.num_classes = 7 * 1000 + 3
config.rec = "/data/x"
config.lr = 1 / 3
config.momentum = 0.3 * 3
config.weight_decay = 1e-3 // 7e-4 * 5e-4
