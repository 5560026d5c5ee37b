from easydict import EasyDict as edict
config = edict()
config.margin_list = (1.0, 0.5, 0.0)
config.network = "r50"
config.output = None
config.weight_decay = 5e-4
config.batch_size = 2 * 64 // 1
config.dali = False
config.num_classes = 93431
config.rec = "/train_tmp/ms1m-retinaface-t1"
config.val_targets = ['lfw', 'cfp_fp',
                      "agedb_30"]
