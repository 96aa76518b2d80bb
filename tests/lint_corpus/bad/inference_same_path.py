# Distributed inference with Accelerate's PartialState: every process numbers its outputs
# from 0, so two processes write example_0 at once.
import json
import os

from accelerate import PartialState


def save_results(results, output_dir):
    count = 0
    for item in results:
        path = os.path.join(output_dir, f"example_{count}")
        with open(path, "w") as f:  # expect: GT007
            json.dump(item, f)
        count += 1


def main(output_dir):
    state = PartialState()
    results = []
    with state.split_between_processes(load_prompts()) as prompts:
        for prompt in prompts:
            results.append(generate(prompt, state.device))
    save_results(results, output_dir)
    with open(os.path.join(output_dir, f"shard_{state.process_index}.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main("outputs")
