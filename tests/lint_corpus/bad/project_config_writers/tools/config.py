# Two config writers (issue 33): one called at start-up on every rank (reported), one called
# only on the single-process path of `if args.dist == "OFF":` (not reported).
def write_start_config(args):
    with open(args.out + "/config.ini", "w") as f:  # expect: GT007
        f.write(str(args))


def save_config(args, epoch):
    with open(args.out + "/last_config.ini", "w") as f:
        f.write(f"{args} {epoch}")
