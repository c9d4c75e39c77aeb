set -x
D=.gpu_data/cifar10/train.parquet
O="$(dirname "$PWD")/gpu"  # the harness runs its copy of the checkout and packs gpu/ beside it
date
mkdir -p $O/qs && (cd $O/qs && time python3 -m finetune.cli quickstart > $O/qs/log.txt 2>&1; echo "quickstart exit $?"); tr '\r' '\n' < $O/qs/log.txt | grep -a 'torch.compile\|Summary\|validation accuracy 9' | tail -12
date
python3 benchmarks/gpu_suite.py --parts notebook_job --data $D --output $O/notebook; date
