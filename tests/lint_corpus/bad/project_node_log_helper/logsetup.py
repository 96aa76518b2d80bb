# A log file opened (mode "w": emptied on opening) by a helper that the training script
# calls under `accelerator.is_local_main_process`: local rank 0 of every node truncates and
# writes the same file.
import logging
import os

_log = None


def start_log(folder="./"):
    global _log
    os.makedirs(folder, exist_ok=True)
    _log = logging.getLogger("run")
    handler = logging.FileHandler(os.path.join(folder, "run.log"), mode="w")  # expect: GT017
    _log.addHandler(handler)
    return _log
