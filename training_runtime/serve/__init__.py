"""What a trained model becomes: its card and safetensors weights, ONNX export, loading for serving,
generation, and evaluation of the written weights."""
