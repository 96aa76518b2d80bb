# A timm loader with the prefetcher off: create_loader returns a plain DataLoader, which
# Accelerate's prepare() re-wraps and reseeds every epoch.
import timm
import timm.data
import torch
from accelerate import Accelerator


def prepared_plain(args, train_set):
    accelerator = Accelerator()
    model = timm.create_model(args.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = timm.data.create_loader(
        train_set,
        input_size=(3, 224, 224),
        batch_size=8,
        is_training=True,
        use_prefetcher=False,
        distributed=accelerator.use_distributed,
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(args.epochs):
        for images, targets in loader:
            accelerator.backward(
                torch.nn.functional.cross_entropy(model(images), targets)
            )
            optimizer.step()
