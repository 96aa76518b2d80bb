# The script: a helper creates the group, an imported class trains, nothing destroys it.
from pkg import dist_util
from pkg.train_util import TrainLoop


def main():
    args = create_argparser().parse_args()
    dist_util.setup_dist()  # expect: GT015
    model = create_model(args)
    TrainLoop(model=model, data=load_data(args), lr=args.lr).run_loop()


if __name__ == "__main__":
    main()
