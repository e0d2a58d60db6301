# loadkit as a container: the load generator only (the server is the NGC tritonserver image).
# Used by docker-compose.yml and deploy/ manifests; no embedded Triton inside.
FROM python:3.11-slim
WORKDIR /loadkit
COPY pyproject.toml README.md ./
COPY loadkit ./loadkit
RUN pip install --no-cache-dir .
COPY locustfile.py ./
COPY scenarios ./scenarios
COPY model_repository ./model_repository
ENTRYPOINT ["loadkit"]
