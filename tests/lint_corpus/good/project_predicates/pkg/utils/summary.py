import csv


def update_summary(epoch, metrics, filename, write_header=False):
    with open(filename, mode="a") as cf:
        writer = csv.DictWriter(cf, fieldnames=["epoch", *metrics])
        if write_header:
            writer.writeheader()
        writer.writerow({"epoch": epoch, **metrics})
