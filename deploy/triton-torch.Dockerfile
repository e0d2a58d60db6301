# The stock NGC Triton image plus what model_repository/dense_torch's model.py imports (torch),
# pinned: the python backend runs models with the image's own python3, which has numpy and no
# torch (server#4302, #5461). 24.10 is Triton 2.51 on Ubuntu 22.04 (python 3.10), CUDA 12.6.
#   docker build -f deploy/triton-torch.Dockerfile -t triton-torch:24.10 .
FROM nvcr.io/nvidia/tritonserver:24.10-py3
RUN pip3 install --no-cache-dir torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124
