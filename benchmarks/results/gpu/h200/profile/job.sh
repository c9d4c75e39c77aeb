# One GPU job (started by .gpu_data/harness/start.sh "bash .gpu_data/job.sh"), everything under gpu/ beside the
# harness's copy of the checkout (its working folder), which the harness packs.
set -x
D=.gpu_data/cifar10/train.parquet
O="$(dirname "$PWD")/gpu"
date
python3 -c "import torch, transformers, accelerate, datasets; print(torch.__version__, transformers.__version__, accelerate.__version__, datasets.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
mkdir -p $O/qs && (cd $O/qs && time python3 -m finetune.cli quickstart > $O/qs/log.txt 2>&1; echo "quickstart exit $?"); tail -12 $O/qs/log.txt
date
python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path
import gpu_suite; gpu_suite.notebook_checkpoint(Path('../ckpt'), {})"
P="--config configs/cifar10_vit_b16.yaml --model_name_or_path ../ckpt --dataset_name $D --overwrite_output_dir true --report_to none --save_strategy no --load_best_model_at_end false"
python3 benchmarks/profile_step.py  --profile_output $O/profile/auto32 --profile_after 60 --profile_steps 20 $P --output_dir ../runs/auto32 > $O/profile_auto32.log 2>&1; echo "exit $?"; date
python3 benchmarks/profile_step.py  --profile_output $O/profile/eager32 --profile_after 60 --profile_steps 20 $P --output_dir ../runs/eager32 --torch_compile false > $O/profile_eager32.log 2>&1; echo "exit $?"; date
python3 benchmarks/gpu_suite.py --parts notebook_job --data $D --output $O/notebook; date
python3 benchmarks/profile_step.py  --profile_output $O/profile/eager512 --profile_after 30 --profile_steps 10 $P --output_dir ../runs/eager512 --torch_compile false --per_device_train_batch_size 512 --learning_rate 8e-5 > $O/profile_eager512.log 2>&1; echo "exit $?"; date
python3 benchmarks/profile_step.py  --profile_output $O/profile/auto32_noclip --profile_after 60 --profile_steps 20 $P --output_dir ../runs/auto32n --max_grad_norm 0 > $O/profile_auto32_noclip.log 2>&1; echo "exit $?"; date
