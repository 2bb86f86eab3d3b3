"""Train torchvision's ResNet-18 on Fashion-MNIST twice from the same weights and data order,
dense and with dropit (gamma = 0.9), and compare test accuracy, measured memory (the step's peak and
what forward holds for backward) and step time.

The images are enlarged from 28x28 to 64x64 (--image-size) so that the activations, which dropit
compresses, outweigh the weights' gradients and the optimizer's state, which it does not.

    python3 examples/python/train_fashion_mnist.py --demo      # a few minutes on 2 cores
    python3 examples/python/train_fashion_mnist.py --epochs 5 --train-subset 0
"""

import argparse
import copy
import sys

import torch
import torchvision
from torch import nn

import dropit
import fashion_mnist_harness as harness


def resnet18_one_channel():
    """torchvision's ResNet-18 with a one-channel 3x3 stem, so small images keep some resolution."""
    model = torchvision.models.resnet18(num_classes=10)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=3, stride=2, padding=1, bias=False)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", action="store_true",
                        help="short run, same settings: 1 epoch on 6000 training images, 2000 "
                        "test images")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-subset", type=int, default=20000, help="0 for all 60000")
    parser.add_argument("--test-subset", type=int, default=0, help="0 for all 10000")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=64,
                        help="images are resized from 28x28 to this size")
    parser.add_argument("--lr", type=float, default=0.02,
                        help="the one-cycle schedule's highest learning rate")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--data-dir", default=harness.DATA_DIR)
    parser.add_argument("--out-dir", default="fashion_mnist_results")
    args = parser.parse_args()
    if args.demo:
        args.epochs, args.train_subset, args.test_subset = 1, 6000, 2000
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    train_set = harness.load_split("train", args.train_subset, args.data_dir)
    test_set = harness.load_split("t10k", args.test_subset, args.data_dir)

    torch.manual_seed(args.seed)
    dense = resnet18_one_channel()
    model = copy.deepcopy(dense)
    # The one dropit line: every Linear and Conv2d (but the first) now caches 10 % of its input,
    # and every ReLU keeps a 1-bit mask instead of its output.
    example = harness.resize(train_set[0][:args.batch], args.image_size)
    report = dropit.convert(model, gamma=args.gamma, example_input=example)
    print(report)

    runs = harness.train_side_by_side({"dense": dense, "dropit": model}, train_set, test_set,
                                      args.epochs, args.batch, args.lr, args.seed, args.image_size)
    header = (f"Command: `python3 examples/python/train_fashion_mnist.py {' '.join(sys.argv[1:])}`; "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
              f"{harness.machine()}.")
    print(harness.write_results(runs, args.out_dir, header))
    print(f"(loss curves: {args.out_dir}/losses.csv and curves.png)")


if __name__ == "__main__":
    main()
