import time, sys, torch, torch.nn.functional as F
import tunecl.backend
d = "opencl"
shape = tuple(int(v) for v in sys.argv[1].split("x")) if len(sys.argv) > 1 else (2, 64, 8, 8)
x = torch.randn(*shape, device=d); g = torch.randn(*shape, device=d); y = torch.relu(x)
cases = {
 "threshold_backward": lambda: torch.ops.aten.threshold_backward(g, y, 0.0),
 "add": lambda: torch.add(x, g),
 "add_": lambda: x.add_(g),
 "relu_": lambda: y.relu_(),
 "empty_like": lambda: torch.empty_like(x),
}
N = 300
for name, f in cases.items():
    for _ in range(20): f()
    torch.opencl.synchronize()
    best = 1e9
    for r in range(5):
        t = time.perf_counter()
        for _ in range(N): f()
        best = min(best, (time.perf_counter() - t) / N * 1e6)
        torch.opencl.synchronize()
    print(f"{name:20s} {best:7.1f} us")
