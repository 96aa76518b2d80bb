# A project helper that saves a merged model into the directory its caller names (issue 33,
# round 6): called unguarded after training on every process, every rank writes it.
import os

from transformers import AutoModelForCausalLM


def merge_adapter(base_name, output_dir):
    model = AutoModelForCausalLM.from_pretrained(base_name)
    output_dir = os.path.join(output_dir, "merged")
    model.save_pretrained(output_dir)  # expect: GT007
