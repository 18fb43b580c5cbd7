# One image for every part of Junction: `junction api`, `serve`, `route`, `dashboard`, `worker`,
# `beat`, `migrate` (docker-compose.yml picks the command). Built from the pinned pyproject; on
# x86_64 Linux, torch==2.13.0 from PyPI is the CUDA build, so the engine uses a GPU when the
# container is given one (docker-compose.gpu.yml) and the CPU otherwise.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
RUN useradd --create-home --uid 1000 junction

RUN pip install --upgrade pip==25.3
COPY pyproject.toml README.md alembic.ini ./
COPY migrations migrations
COPY engine engine
COPY workloads workloads
COPY protocol protocol
COPY bench bench
COPY whatif whatif
COPY sharedstore sharedstore
COPY client client
COPY publish publish
COPY serve serve
COPY attach attach
COPY router router
COPY api api
COPY dashboard dashboard
COPY jobs jobs
COPY stack stack
COPY cli cli
COPY examples examples
# editable: `junction migrate` finds alembic.ini and migrations/ beside the code
RUN pip install -e . && chown -R junction /app

USER junction
EXPOSE 8080 8000 8501
ENTRYPOINT ["junction"]
CMD ["up", "--host", "0.0.0.0"]
