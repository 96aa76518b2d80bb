# A tensor-parallel evaluation script (issue 33): every rank must see the same batches, so
# its DataLoaders have no DistributedSampler on purpose. Nothing consumes them in a training
# step: no backward, no optimizer step, directly or through a function of the file.
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from tqdm import tqdm


def score(model, batch):
    with torch.no_grad():
        return model.generate(batch["input_ids"]).tolist()


class PrecisionTest:
    def __init__(self, model, dataset, batch_size):
        self.model = model
        self.dataset = dataset
        self.batch_size = batch_size

    def run(self):
        results = []
        loader = DataLoader(self.dataset, batch_size=self.batch_size)
        for batch in tqdm(loader, disable=dist.get_rank() != 0):
            results += score(self.model, batch)
        return results

    def run_shuffled(self):
        loader = DataLoader(self.dataset, batch_size=self.batch_size, shuffle=True)
        for step, batch in enumerate(loader):
            self.model(batch)
            if step > 10:
                break


def main(model, dataset):
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
    test = PrecisionTest(model, dataset, 8)
    answers = test.run()
    test.run_shuffled()
    if dist.get_rank() == 0:
        print(len(answers))
    dist.destroy_process_group()
