"""A run directory mirrored to ``pipeline.storage_path``: a cluster filesystem path or an object-store URI.

Stages work in the local ``run_dir``; after each finished stage the pipeline
pushes what changed to the storage path (any filesystem pyarrow opens:
``s3://bucket/prefix``, ``gs://``, ``hdfs://``, ``file:///mnt/...`` or a
plain path), the manifest last, so a copy whose manifest names a stage holds
that stage's outputs. A pipeline started on a ``run_dir`` without a manifest
pulls the stored run first, and so resumes where another machine left off.
"""

from __future__ import annotations

from pathlib import Path

from environments.errors import TraceRayError
from trace_ray.run_manifest import MANIFEST


class RunStorage:
    def __init__(self, uri: str, run_dir: Path):
        import pyarrow.fs

        try:
            self.filesystem, self.root = pyarrow.fs.FileSystem.from_uri(uri)
        except (pyarrow.ArrowInvalid, pyarrow.ArrowNotImplementedError, OSError) as exc:
            raise TraceRayError(
                f"pipeline.storage_path={uri} cannot be opened ({str(exc).splitlines()[0]}); "
                "give a path or a URI pyarrow reads (s3://bucket/prefix, gs://bucket/prefix, hdfs://host/path)"
            ) from None
        self.uri = uri
        self.run_dir = run_dir
        self.pushed: dict[str, tuple[int, int]] = {}  # relative path -> (size, mtime_ns) when last pushed

    def _stored(self, relative: str) -> str:
        return f"{self.root.rstrip('/')}/{relative}"

    def holds_run(self) -> bool:
        import pyarrow.fs

        try:
            return self.filesystem.get_file_info(self._stored(MANIFEST)).type == pyarrow.fs.FileType.File
        except OSError as exc:
            raise TraceRayError(
                f"pipeline.storage_path={self.uri} is unreachable ({str(exc).splitlines()[0]}); check "
                "the URI and credentials"
            ) from None

    def pull(self) -> bool:
        """Copy the stored run into an empty ``run_dir`` (one without a manifest); whether it did."""
        import pyarrow.fs

        if (self.run_dir / MANIFEST).exists() or not self.holds_run():
            return False
        selector = pyarrow.fs.FileSelector(self.root.rstrip("/"), recursive=True)
        files = [info for info in self.filesystem.get_file_info(selector) if info.type == pyarrow.fs.FileType.File]
        prefix = len(self.root.rstrip("/")) + 1
        for info in sorted(files, key=lambda info: info.path.endswith(MANIFEST)):  # the manifest last
            target = self.run_dir / info.path[prefix:]
            target.parent.mkdir(parents=True, exist_ok=True)
            pyarrow.fs.copy_files(info.path, str(target), source_filesystem=self.filesystem)
        self.pushed = self._local_files()
        return True

    def push(self) -> int:
        """Copy the files of ``run_dir`` that changed since the last push, the manifest last; how many."""
        import pyarrow.fs

        files = self._local_files()
        changed = [relative for relative, stamp in files.items() if self.pushed.get(relative) != stamp]
        try:
            for relative in sorted(changed, key=lambda relative: relative == MANIFEST):
                destination = self._stored(relative)
                self.filesystem.create_dir(destination.rsplit("/", 1)[0], recursive=True)
                pyarrow.fs.copy_files(str(self.run_dir / relative), destination, destination_filesystem=self.filesystem)
        except OSError as exc:
            raise TraceRayError(
                f"cannot write to pipeline.storage_path={self.uri} ({str(exc).splitlines()[0]}); check "
                "the URI and credentials"
            ) from None
        self.pushed.update({relative: files[relative] for relative in changed})
        return len(changed)

    def _local_files(self) -> dict[str, tuple[int, int]]:
        stamps = {}
        for path in self.run_dir.rglob("*"):
            if path.is_file():
                stat = path.stat()
                stamps[path.relative_to(self.run_dir).as_posix()] = (stat.st_size, stat.st_mtime_ns)
        return stamps
