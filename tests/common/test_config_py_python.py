"""arcface_torch .py configs: pfcps's reader (common/config_py.c, through `pfcps config-get`) against Python
itself. Every file of tests/common/config_py and the config fuzz seed ms1mv3_r50.py is run by this Python
(exec, with a stand-in easydict module: an attribute dict) and each key it sets must come out of config-get
with the same value: ints equal, floats bit for bit, strings equal, booleans true / false, tuples and lists
element by element, `output = None` as work_dirs/<file name>. arcface_torch keys pfcps ignores are left out.
Then files Python reads differently from what pfcps could evaluate (statements joined by ';', an indented
line, a second `config = edict()`, ...) must be refused, exit 2, naming file:line; for each the value
Python gives is printed beside the refusal.
Arguments: PFCPS SOURCE_ROOT. Needs only the standard library (Debian's python3)."""
import os
import subprocess
import sys
import tempfile
import types

PFCPS, SRC = sys.argv[1], sys.argv[2]
IGNORED = {"dali", "dali_aug", "using_wandb", "suffix_run_name", "notes",
           "save_all_states_interval", "save_artifacts", "image_size"}
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL:", msg)


class AttrDict(dict):
    """easydict.EasyDict as far as the configs use it: attribute writes and reads are the dict's items."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k)

    def __setattr__(self, k, v):
        self[k] = v


def python_config(path):
    """The config a file builds when Python runs it."""
    easydict = types.ModuleType("easydict")
    easydict.EasyDict = AttrDict
    sys.modules["easydict"] = easydict
    g = {"__name__": "config_under_test"}
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec"), g)  # bytes: Python honours a UTF-8 BOM
    return g["config"]


def config_get(path, keys):
    r = subprocess.run([PFCPS, "config-get", "-c", path] + keys, capture_output=True, text=True)
    return r.returncode, r.stdout.split("\n")[:len(keys)], r.stderr


def same(py, text):
    """Is config-get's text the value Python computed?"""
    if isinstance(py, bool):
        return text == ("true" if py else "false")
    if isinstance(py, int):
        return text == str(py)
    if isinstance(py, float):
        return float(text) == py
    if isinstance(py, str):
        return text == py
    if isinstance(py, (tuple, list)):
        parts = text.split(", ") if text else []
        return len(parts) == len(py) and all(same(a, b) for a, b in zip(py, parts))
    return False


folder = os.path.join(SRC, "tests", "common", "config_py")
files = sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".py"))
files.append(os.path.join(SRC, "tests", "common", "fuzz_ctl_config_corpus", "ms1mv3_r50.py"))
for path in files:
    cfg = python_config(path)
    keys = [k for k in cfg if k not in IGNORED and not k.startswith("wandb_")]
    keys = [k for k in keys if cfg[k] is not None or k == "output"]
    if "output" not in keys:
        keys.append("output")
    rc, got, err = config_get(path, keys)
    if rc != 0:
        fail("%s: config-get exit %d: %s" % (path, rc, err.strip()))
        continue
    stem = os.path.basename(path)[:-3]
    for k, text in zip(keys, got):
        want = cfg.get(k)
        if k == "output" and want is None:
            want = "work_dirs/" + stem
        if not same(want, text):
            fail("%s: %s: Python %r, pfcps %r" % (path, k, want, text))
    print("%s: %d keys as Python computes them" % (os.path.relpath(path, SRC), len(keys)))

HEAD = "from easydict import EasyDict as edict\nconfig = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n"
# (text, line pfcps names, words of its message, the key whose Python value is printed)
REFUSED = [
    (HEAD + "import os; config.lr = 5.0\n", 5, "';' joins", "lr"),
    (HEAD + "import os; os.system('true')\n", 5, "';' joins", None),
    (HEAD + "config.lr = 5.0;\n", 5, "';' joins", "lr"),
    (HEAD + "config.lr = 0.5; config.lr = 5.0\n", 5, "';' joins", "lr"),
    (HEAD + "if True:\n    config.lr = 5.0\n", 5, "expected 'config.KEY", "lr"),
    (HEAD + "config.lr = 5.0\nconfig = edict()\nconfig.num_classes = 10\nconfig.rec = 'x'\n", 6,
     "second 'config = edict()'", "lr"),
    (HEAD + "from os import path as config\n", 5, "binds the name 'config'", None),
    (HEAD + "from collections import OrderedDict as edict\n", 5, "'edict' / 'EasyDict'", None),
    (HEAD + "from os import *\n", 5, "'import *'", None),
    (HEAD + "config.lr = 5.0 if True else 0.1\n", 5, "unexpected text", "lr"),
]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "bad.py")
    for text, line, words, key in REFUSED:
        with open(path, "w") as f:
            f.write(text)
        try:
            cfg = python_config(path)
            py = "config.%s = %r" % (key, cfg.get(key)) if key else "runs"
        except Exception as e:  # noqa: BLE001 - only printed
            py = "%s: %s" % (type(e).__name__, e)
        rc, _, err = config_get(path, ["lr"])
        where = "bad.py:%d:" % line
        if rc != 2 or where not in err or words not in err:
            fail("%r: exit %d, wanted 2 with '%s' and '%s': %s" % (text[len(HEAD):], rc, where, words,
                                                                     err.strip()))
        else:
            print("refused (Python: %s): %s" % (py, err.strip().split("\n")[-1]))
print("ok" if fails == 0 else "FAIL")
sys.exit(1 if fails else 0)
