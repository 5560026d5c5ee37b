from os import path as config
from collections import OrderedDict as edict
from os import *
