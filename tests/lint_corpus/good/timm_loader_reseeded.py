# A timm loader whose distributed sampler is reseeded by hand each epoch.
import timm
import timm.data
import torch


def by_hand(args, train_set, model):
    loader = timm.data.create_loader(
        train_set,
        input_size=(3, 224, 224),
        batch_size=8,
        is_training=True,
        distributed=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        for images, targets in loader:
            torch.nn.functional.cross_entropy(model(images), targets).backward()
            optimizer.step()
