# timm's create_loader builds a shuffling DistributedSampler for a distributed training
# loader; with its default prefetcher it returns a PrefetchLoader, which Accelerate's
# prepare() leaves as it is (it re-wraps DataLoaders only): nobody reseeds the sampler.
import timm
import timm.data
import torch
from accelerate import Accelerator


def main(args, train_set):
    accelerator = Accelerator()
    model = timm.create_model(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = timm.data.create_loader(
        train_set,
        input_size=(3, 224, 224),
        batch_size=args.batch_size,
        is_training=True,
        distributed=accelerator.use_distributed,
        device=accelerator.device,
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(args.epochs):  # expect: GT005
        model.train()
        for images, targets in loader:
            accelerator.backward(
                torch.nn.functional.cross_entropy(model(images), targets)
            )
            optimizer.step()
            optimizer.zero_grad()
