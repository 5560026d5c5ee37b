from easydict import EasyDict as edict
import os; config.lr = 5.0
