# The notebook job at batch 32 with torch_compile: false, against auto's 85.1 s (main 7450487, another H200 call).
set -x
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "
import sys; sys.path.insert(0, 'benchmarks')
from pathlib import Path
import gpu_suite
gpu_suite.notebook_checkpoint(Path('TMPDIR/vit-in21k'), {})
"
python3 benchmarks/timed_run.py --config configs/cifar10_vit_b16.yaml --model_name_or_path TMPDIR/vit-in21k --dataset_name .gpu_data/cifar10/train.parquet --torch_compile false --output_dir gpu_out/eager32 --overwrite_output_dir true --report_to none
python3 -c "import json; r=json.load(open('gpu_out/eager32/results.json')); print('TRAIN', r['train'], r['hyperparameters'].get('torch_compile'), r['wall_seconds'])"
