# runledger itself (CLI, projector, worker) for deploy/compose.yaml, built offline like the
# sandbox image: FROM the local Debian base, runledger's packages and its dependencies' wheels
# unpacked onto PYTHONPATH (the base has no pip). Build context: made by compose/build-images.sh.
ARG BASE=runledger/debian-python:bookworm
FROM ${BASE}
COPY runtime/ /opt/runledger/
RUN set -e; \
    python3 -c 'import glob, pathlib, shutil, zipfile; S = "/opt/runledger/site"; \
[zipfile.ZipFile(w).extractall(S) for w in sorted(glob.glob("/opt/runledger/wheels/*.whl"))]; \
[shutil.copytree(p, S, dirs_exist_ok=True) for p in pathlib.Path(S).glob("*.data/*lib")]; \
[shutil.rmtree(p) for p in pathlib.Path(S).glob("*.data")]'; \
    rm -rf /opt/runledger/wheels; \
    python3 -m compileall -q /opt/runledger
ENV PYTHONPATH=/opt/runledger:/opt/runledger/site \
    PYTHONUNBUFFERED=1 \
    RUNLEDGER_HOME=/var/lib/runledger
ENTRYPOINT ["python3", "-m", "runledger"]
CMD ["--help"]
