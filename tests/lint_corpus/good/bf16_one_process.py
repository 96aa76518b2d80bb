# A single-process script (no process group, no launcher, no framework; `dist` is a
# probability distribution) that steps a bf16 model with torch.optim.Adam. The linter checks
# distributed training: GT019 is reported where a process group runs the code
# (bad/bf16_adamw.py), not here (issue 33, set 15).
import torch
from torch.distributions import Categorical
from transformers import AutoModelForCausalLM


def main(name, prompts):
    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).to("cuda")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    for prompt in prompts:
        dist = Categorical(logits=model(prompt.to("cuda")).logits)
        loss = -dist.log_prob(dist.sample()).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main("some/model", [])
