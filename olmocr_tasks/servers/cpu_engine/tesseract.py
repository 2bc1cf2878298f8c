"""Tesseract for the CPU engine: one subprocess per page, orientation from OSD, text tidied into paragraphs."""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

from PIL import Image

from olmocr_tasks.core.errors import ConfigurationError

logger = logging.getLogger(__name__)

INSTALL_HINT = "install the tesseract-ocr package: sudo apt-get install tesseract-ocr"
DEFAULT_OSD_MIN_CONFIDENCE = 2.0

# Tesseract language codes the engine can report as olmOCR's ISO 639-1 primary_language.
_ISO_639_1 = {
    "eng": "en",
    "deu": "de",
    "fra": "fr",
    "spa": "es",
    "ita": "it",
    "por": "pt",
    "nld": "nl",
    "swe": "sv",
    "dan": "da",
    "nor": "no",
    "fin": "fi",
    "pol": "pl",
    "ces": "cs",
    "rus": "ru",
    "ukr": "uk",
    "tur": "tr",
    "ell": "el",
    "chi_sim": "zh",
    "chi_tra": "zh",
    "jpn": "ja",
    "kor": "ko",
    "ara": "ar",
    "heb": "he",
    "hin": "hi",
}

_LIST_ITEM = re.compile(r"^(?:[-*\u2022\u00b7\u25aa\u25cf\u2013]\s|\(?\d{1,3}[.)]\s|\(?[a-zA-Z][.)]\s)")


class TesseractNotFoundError(ConfigurationError):
    """The ``tesseract`` binary (or the requested language data) is not installed."""


@dataclass(frozen=True)
class PageOcr:
    """Tesseract's reading of one page image."""

    text: str
    rotation_correction: int
    width: int
    height: int


class Tesseract:
    """Runs the Tesseract binary; one instance is shared by all request threads."""

    def __init__(
        self,
        binary: str = "tesseract",
        lang: str = "eng",
        detect_rotation: bool = True,
        osd_min_confidence: float = DEFAULT_OSD_MIN_CONFIDENCE,
        timeout_s: float = 120.0,
    ) -> None:
        path = shutil.which(binary)
        if path is None:
            raise TesseractNotFoundError(f"the tesseract binary {binary!r} was not found; {INSTALL_HINT}")
        self.binary = path
        self.lang = lang
        self.timeout_s = timeout_s
        self.osd_min_confidence = osd_min_confidence
        # One thread per Tesseract process: its OpenMP default spins every core per process and
        # was ~8x slower per page on a 2-core machine; parallelism comes from our semaphore instead.
        self._env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
        self._children: set[subprocess.Popen[bytes]] = set()
        self._children_lock = threading.Lock()
        self.version = self._read_version()
        available = self._list_langs()
        missing = [code for code in lang.split("+") if code not in available]
        if missing:
            packages = " ".join("tesseract-ocr-" + code.replace("_", "-").lower() for code in missing)
            raise TesseractNotFoundError(
                f"Tesseract language data {'+'.join(missing)!r} is missing: sudo apt-get install {packages}"
            )
        self.osd_available = "osd" in available
        self.detect_rotation = detect_rotation and self.osd_available
        if detect_rotation and not self.osd_available:
            logger.warning("Tesseract OSD data is missing; every page will be reported upright")

    def _read_version(self) -> str:
        proc = subprocess.run([self.binary, "--version"], capture_output=True, timeout=30, env=self._env)
        first = (proc.stdout or proc.stderr).decode("utf-8", "replace").strip().splitlines()
        return first[0] if first else "tesseract"

    def _list_langs(self) -> set[str]:
        proc = subprocess.run([self.binary, "--list-langs"], capture_output=True, timeout=30, env=self._env)
        lines = (proc.stdout + proc.stderr).decode("utf-8", "replace").splitlines()
        return {line.strip() for line in lines if line.strip() and not line.startswith("List of")}

    def _run(self, args: list[str], image_png: bytes) -> subprocess.CompletedProcess[bytes]:
        # Popen instead of subprocess.run so stop() can kill pages still running at shutdown.
        proc = subprocess.Popen(
            [self.binary, "-", "stdout", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self._env,
        )
        with self._children_lock:
            self._children.add(proc)
        try:
            stdout, stderr = proc.communicate(image_png, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        finally:
            with self._children_lock:
                self._children.discard(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def kill_running(self) -> None:
        with self._children_lock:
            children = list(self._children)
        for proc in children:
            proc.kill()

    def rotation_correction(self, image_png: bytes) -> int:
        """olmOCR's rotation_correction for the image: 0 when upright or when OSD cannot tell."""
        if not self.detect_rotation:
            return 0
        proc = self._run(["--psm", "0"], image_png)
        if proc.returncode != 0:
            return 0  # "Too few characters": nothing to orient by
        return parse_osd(proc.stdout.decode("utf-8", "replace"), self.osd_min_confidence)

    def recognize(self, image_png: bytes) -> str:
        proc = self._run(["-l", self.lang, "--psm", "3"], image_png)
        if proc.returncode != 0:
            detail = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise RuntimeError(f"tesseract failed with exit code {proc.returncode}: {detail[-1:]}")
        return proc.stdout.decode("utf-8", "replace")

    def read_page(self, image: Image.Image, image_png: bytes) -> PageOcr:
        correction = self.rotation_correction(image_png)
        if correction:
            # Read the text upright so the answer is useful even if the client ends up accepting it.
            upright = image.transpose(_TRANSPOSE[correction])
            buffer = io.BytesIO()
            upright.save(buffer, format="PNG", compress_level=1)
            image_png = buffer.getvalue()
        text = tidy_text(self.recognize(image_png))
        return PageOcr(text=text, rotation_correction=correction, width=image.width, height=image.height)


_TRANSPOSE = {
    90: Image.Transpose.ROTATE_90,
    180: Image.Transpose.ROTATE_180,
    270: Image.Transpose.ROTATE_270,
}


def parse_osd(output: str, min_confidence: float = DEFAULT_OSD_MIN_CONFIDENCE) -> int:
    """Turn ``tesseract --psm 0`` output into olmOCR's rotation_correction.

    Tesseract's ``Rotate: R`` is the clockwise turn that makes the page upright; olmOCR's value is
    the PIL ``Transpose.ROTATE_*`` (counter-clockwise) that does the same, hence ``(360 - R) % 360``.
    """
    rotate = re.search(r"^Rotate:\s*(\d+)", output, re.MULTILINE)
    confidence = re.search(r"^Orientation confidence:\s*([0-9.]+)", output, re.MULTILINE)
    if rotate is None:
        return 0
    if confidence is not None and float(confidence.group(1)) < min_confidence:
        return 0
    correction = (360 - int(rotate.group(1))) % 360
    return correction if correction in (0, 90, 180, 270) else 0


def tidy_text(raw: str) -> str:
    """Tesseract's lines to markdown paragraphs.

    Tesseract breaks at every printed line; olmOCR answers with one line per paragraph, so lines of a
    paragraph are joined (list items keep their own line) and words hyphenated across a line break are
    rejoined (a compound such as state-of-the-art keeps its hyphens).
    """
    text = raw.replace("\r\n", "\n").replace("\f", "\n")
    paragraphs: list[str] = []
    for block in re.split(r"\n[ \t]*\n", text):
        lines = [re.sub(r"[ \t]+", " ", line).strip() for line in block.split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        out = lines[0]
        for line in lines[1:]:
            if _LIST_ITEM.match(line):
                out += "\n" + line
                continue
            last_word = out.rsplit(None, 1)[-1] if out.strip() else ""
            if len(last_word) > 2 and last_word.endswith("-") and last_word[-2].isalpha() and line[0].islower():
                # "exam-" + "ple" is one word; "state-of-the-" + "art" keeps its hyphens.
                out = (out[:-1] if last_word.count("-") == 1 else out) + line
            else:
                out += " " + line
        paragraphs.append(out)
    return "\n\n".join(paragraphs)


def primary_language(text: str, lang: str) -> str | None:
    """olmOCR's ISO 639-1 primary_language for text read with Tesseract language(s) ``lang``."""
    if not any(ch.isalpha() for ch in text):
        return None
    return _ISO_639_1.get(lang.split("+")[0])
