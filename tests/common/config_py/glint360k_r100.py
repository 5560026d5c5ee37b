from easydict import EasyDict as edict
import os
config = edict()  # the config
config.num_classes = 360232
config.num_image = 17091657
config.num_epoch = 20
config.warmup_epoch = config.num_epoch // 10
config.network = 'r100'
config.output = config.network
config.sample_rate = 0.2 # comment
config.batch_size = 2 * 64
config.frequent = 30 * 10000 // 1000 - (2 + 8)
config.verbose = 1_000
config.lr = 0.4 / 4
config.weight_decay = -(-1e-4)
config.seed = +2048
config.val_targets = [
    'lfw',  # LFW
    'agedb_30',
]
config.margin_list = (1.0, 0.0, 0.4,)
config.dali = True
config.dali_aug = False
config.gradient_acc = 1
config.using_wandb = False
config.wandb_key = "XXXX"
config.wandb_entity = 'e'
config.suffix_run_name = None
config.rec = '/data/glint360k'
