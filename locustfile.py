"""Entry point Locust loads: the OCR user and the stepped plan, wired from loadtest/.

locust -f locustfile.py --headless --host http://gpu-box:8000 --ocr-style multipart ...
python -m loadtest run --host ...   (the same, plus pre-flight checks, workers, analysis and report)
"""

from loadtest.traffic.users import OcrUser
from loadtest.wiring.listeners import wire
from loadtest.wiring.shape import SteppedPlanShape

wire()

__all__ = ["OcrUser", "SteppedPlanShape"]
