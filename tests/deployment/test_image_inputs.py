"""A scanned archive through the deployment: page images beside a PDF on S3, converted by REST-triggered
runs of the ingestion DAG (issue 32).

The first run takes the ``formats`` Param (TIFF only) and converts the scans alone; the second, with
every format, converts the rest, finds the TIFF already converted, and fails each broken file with its
class (a TIFF named ``.png``, a decompression bomb) while the others convert. The stand-in names the
document and page each page image showed, so the outputs prove each page reached the model.
"""

from __future__ import annotations

import pytest

from olmocr_testkit import imagegen, pdfgen
from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from tests.deployment.published import assert_outputs_name_their_pages, converted, documents, sources

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
JPEG_DOC = imagegen.JPEG_SAFE_DOC_IDS[2]


def test_a_mixed_folder_of_scans_and_pdfs_converts_by_format(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    files = {
        "input/letter.pdf": (pdfgen.text_pdf(2, 231), 231),
        "input/scans/Bundle.TIF": (imagegen.multipage_tiff(232, 3), 232),
        "input/scans/page.png": (imagegen.encode(imagegen.page_image(233), "PNG"), 233),
        "input/scans/photo.JPG": (imagegen.encode(imagegen.page_image(JPEG_DOC), "JPEG"), JPEG_DOC),
        "input/scans/web.webp": (imagegen.encode(imagegen.page_image(235), "WEBP"), 235),
        "input/scans/liar.png": (imagegen.multipage_tiff(236, 1), 0),
        "input/scans/bomb.png": (imagegen.decompression_bomb_png(), 0),
        "input/scans/notes.txt": (b"not a document", 0),
    }
    for key, (data, _) in files.items():
        bucket.s3.put_object(Bucket=bucket.name, Key=prefix + key, Body=data)
    uri = {key: bucket.uri(prefix + key) for key in files}
    doc_ids = {uri[key]: doc_id for key, (_, doc_id) in files.items() if doc_id}
    output = bucket.uri(f"{prefix}output/")
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output, "max_document_error_rate": 0.5}

    scans_only = _run(deployment, {**conf, "formats": ["tiff"]})
    assert scans_only["state"] == "success"
    first = bucket.manifest(output, DAG, scans_only["dag_run_id"])
    assert first is not None, "the TIFF-only run published no manifest"
    assert sources(first) == converted(first) == [uri["input/scans/Bundle.TIF"]]
    assert documents(first)[uri["input/scans/Bundle.TIF"]]["pages"] == 3

    everything = _run(deployment, conf)
    assert everything["state"] == "success"  # two failures of six are within the run's 50% budget
    second = bucket.manifest(output, DAG, everything["dag_run_id"])
    assert second is not None, "the second run published no manifest"
    by_source = documents(second)
    # The TIFF was converted by the first run.
    assert uri["input/scans/Bundle.TIF"] not in by_source and second["counts"]["already_converted"] == 1
    wanted = ("input/letter.pdf", "input/scans/page.png", "input/scans/photo.JPG", "input/scans/web.webp")
    assert converted(second) == sorted(uri[key] for key in wanted)
    liar, bomb = by_source[uri["input/scans/liar.png"]], by_source[uri["input/scans/bomb.png"]]
    assert (liar["error_class"], bomb["error_class"]) == ("unsupported_format", "too_large"), (liar, bomb)
    assert "named .png but the content is tiff" in liar["error"]
    assert uri["input/scans/notes.txt"] not in by_source
    assert_outputs_name_their_pages(bucket, first, doc_ids)
    assert_outputs_name_their_pages(bucket, second, doc_ids)


def _run(deployment: Deployment, conf: dict[str, object]) -> dict[str, object]:
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    return deployment.api.wait_for_run(DAG, response.json()["dag_run_id"])
