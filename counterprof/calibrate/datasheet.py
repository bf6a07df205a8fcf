"""Vendors' datasheet peaks for the accelerators counterprof knows (CPUs have none).

Dense figures (no structured sparsity), per device as torch sees it (an MI250/MI250X shows as
two devices, one per GCD: half the package's figures). TFLOP/s per dtype on the matrix units
("fp32" is the vector/CUDA-core FP32 where no FP32 matrix path exists), memory bandwidth in
bytes/s. Each entry names its source.
"""
from __future__ import annotations

import re
from typing import Any

T = 1e12
_TABLE = [
    # (name pattern, key, peaks in TFLOP/s, memory bandwidth in TB/s, source)
    (r"V100", "V100", {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 0.9,
     "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf (SXM2)"),
    (r"A100.*80GB", "A100 80GB", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
                                  "fp16": 312.0, "int8": 624.0}, 2.039,
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM)"),
    (r"A100", "A100 40GB", {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0,
                            "fp16": 312.0, "int8": 624.0}, 1.555,
     "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf (SXM 40GB)"),
    (r"H100.*PCIe", "H100 PCIe", {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0,
                                  "fp16": 756.0, "fp8": 1513.0, "int8": 1513.0}, 2.0,
     "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (PCIe, dense)"),
    (r"H100", "H100 SXM", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5,
                           "fp16": 989.5, "fp8": 1979.0, "int8": 1979.0}, 3.35,
     "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (SXM, dense)"),
    (r"H200", "H200 SXM", {"fp64": 67.0, "fp32": 67.0, "tf32": 494.5, "bf16": 989.5,
                           "fp16": 989.5, "fp8": 1979.0, "int8": 1979.0}, 4.8,
     "https://www.nvidia.com/en-us/data-center/h200/ (SXM, dense)"),
    (r"B200", "B200", {"fp64": 40.0, "tf32": 1125.0, "bf16": 2250.0, "fp16": 2250.0,
                       "fp8": 4500.0, "int8": 4500.0}, 8.0,
     "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, per GPU, dense)"),
    (r"MI300X", "MI300X", {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4,
                           "fp16": 1307.4, "fp8": 2614.9, "int8": 2614.9}, 5.3,
     "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf"),
    (r"MI250X", "MI250X (one GCD)", {"fp64": 47.9, "fp32": 47.9, "bf16": 191.5, "fp16": 191.5,
                                     "int8": 191.5}, 1.6,
     "https://www.amd.com/content/dam/amd/en/documents/instinct-business-docs/product-briefs/instinct-mi250x-product-brief.pdf (package / 2)"),
    (r"MI250", "MI250 (one GCD)", {"fp64": 45.3, "fp32": 45.3, "bf16": 181.0, "fp16": 181.0,
                                   "int8": 181.0}, 1.6,
     "https://www.amd.com/content/dam/amd/en/documents/instinct-business-docs/product-briefs/instinct-mi250-product-brief.pdf (package / 2)"),
    (r"trn1|Trainium1|Trainium$", "Trainium (trn1, per chip)", {"fp32": 47.5, "tf32": 47.5,
                                                                "bf16": 190.0, "fp16": 190.0, "fp8": 190.0}, 0.82,
     "https://aws.amazon.com/ec2/instance-types/trn1/ (trn1.32xlarge / 16 chips)"),
    (r"trn2|Trainium2", "Trainium2 (trn2, per chip)", {"fp32": 181.0, "tf32": 667.0, "bf16": 667.0,
                                                       "fp16": 667.0, "fp8": 1299.0}, 2.9,
     "https://aws.amazon.com/ec2/instance-types/trn2/ (per chip, dense)"),
]
# AMD devices often report a marketing-free name ("AMD Radeon Graphics"): the GFX architecture
# says which (gcnArchName in torch's device properties)
_ARCH = {"gfx942": "MI300X", "gfx90a": "MI250"}


def lookup(name: str | None, arch: str | None = None) -> dict[str, Any] | None:
    """The ceilings document of a device by its name (as torch/Kineto report it), or None."""
    candidates = [name or ""]
    if arch:
        candidates.append(_ARCH.get(arch.split(":")[0], ""))
    for text in candidates:
        if not text:
            continue
        for pattern, key, peaks, tbps, source in _TABLE:
            if re.search(pattern, text, re.IGNORECASE):
                return {
                    "schema": 1, "source": "datasheet", "device": name or key, "kind": "gpu",
                    "datasheet_entry": key, "reference": source,
                    "peaks": {dt: v * T for dt, v in peaks.items()},
                    "bandwidth_bytes_per_s": tbps * T,
                }
    return None


def known() -> list[str]:
    return [key for _, key, *_ in _TABLE]
