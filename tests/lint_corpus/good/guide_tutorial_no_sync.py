# Guide: PyTorch Distributed Training Tutorial, "Gradient Synchronisation and Communication"
# (shared/seeds/001). Verbatim.
# Temporarily disable gradient sync for gradient accumulation
accumulation_steps = 4
for i, (x, y) in enumerate(loader):
    # Disable sync for all but the last accumulation step
    with model.no_sync() if (i+1) % accumulation_steps != 0 else contextlib.nullcontext():
        out = model(x.to(device))
        loss = criterion(out, y.to(device)) / accumulation_steps
        loss.backward()

    if (i+1) % accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
