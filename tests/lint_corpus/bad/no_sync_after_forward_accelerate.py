# The same with Accelerate's no_sync: the forward ran before the block.
from accelerate import Accelerator


def main(args):
    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(build_model(), build_optimizer(), build_loader())
    for step, batch in enumerate(loader):
        outputs = model(**batch)
        loss = outputs.loss
        if (step + 1) % args.accum != 0:
            with accelerator.no_sync(model):
                accelerator.backward(loss)  # expect: GT016
        else:
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.end_training()


if __name__ == "__main__":
    main(parse_args())
