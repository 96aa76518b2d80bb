# DataParallel for evaluation only (no backward, under torch.no_grad): no gradients to
# reduce, so not the training pitfall GT001 is about.
import torch


def validate(model, loader, num_gpu):
    if num_gpu > 1:
        model = torch.nn.DataParallel(model, device_ids=list(range(num_gpu)))
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
