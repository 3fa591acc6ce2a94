#!/usr/bin/env sh
# Trains the tiny LeNet of lenet_solver.prototxt (BVLC's examples/mnist/train_lenet.sh, for tests).
set -e

./build/tools/caffe train --solver=examples/mnist/lenet_solver.prototxt $@
