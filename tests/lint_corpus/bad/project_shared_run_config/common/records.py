# Helpers of a package that several launch scripts share (issue 33, round 10): each writes one
# fixed file, whoever calls it. The writes are reported here once, and again at every call a
# script makes on every rank (each script is a run in which all ranks write the file).
import json
import time


def dump_run_config(cfg):
    stamp = time.strftime("%Y%m%d-%H%M")
    with open(f"configs/{stamp}.json", "w") as f:  # expect: GT007
        json.dump(cfg, f)


class ResultTable:
    def __init__(self, path):
        self.path = path

    def flush(self, rows):
        with open("results/table.csv", "a") as f:  # expect: GT007
            f.writelines(rows)


def dump_rank_config(cfg, rank):
    with open(f"configs/rank{rank}.json", "w") as f:  # one file per rank: not reported
        json.dump(cfg, f)
