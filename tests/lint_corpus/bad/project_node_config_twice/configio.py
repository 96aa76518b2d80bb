# A config writer of its own module: whoever calls it decides how many processes write.
import json


def write_config(cfg, path):
    with open(path, "w") as handle:  # expect: GT017
        json.dump(cfg, handle)


class RunRecord:
    def __init__(self, folder):
        self.folder = folder

    def dump(self, values):
        with open(self.folder + "/record.json", "w") as handle:  # expect: GT017
            json.dump(values, handle)
