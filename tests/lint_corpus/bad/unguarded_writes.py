# Every rank writes the same files: a checkpoint, a metrics JSON, a plot and a text file.
import json
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.distributed as dist


def finish(model, history):
    torch.save(model.module.state_dict(), "final.pt")  # expect: GT007
    with open("metrics.json", "w") as handle:  # expect: GT007
        json.dump(history, handle)
    plt.plot(history["loss"])
    plt.savefig("loss.png")  # expect: GT007
    Path("DONE").write_text("ok\n")  # expect: GT007
    dist.barrier()
