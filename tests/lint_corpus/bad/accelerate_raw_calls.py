# An Accelerate script: its own helpers (accumulate, print, save) are the right way; the raw
# calls beside them are not.
import torch
from accelerate import Accelerator


def training_function(args):
    accelerator = Accelerator(mixed_precision=args.mixed_precision)
    model, optimizer, train_dataloader = accelerator.prepare(
        build_model(), build_optimizer(), build_loader()
    )
    gradient_accumulation_steps = args.batch_size // 16
    for epoch in range(args.epochs):
        model.train()
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch).loss / gradient_accumulation_steps
            accelerator.backward(loss)  # expect: GT013
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
        print(f"epoch {epoch} done")  # expect: GT008
        accelerator.print(f"epoch {epoch} done")
    torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")  # expect: GT007
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), "model_main.pt")
    accelerator.end_training()


if __name__ == "__main__":
    training_function(parse_args())
