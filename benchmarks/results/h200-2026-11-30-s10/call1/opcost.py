import time, sys, torch, torch.nn.functional as F
import tunecl.backend
d = "opencl"
x = torch.randn(2, 64, 8, 8, device=d)
w = torch.randn(64, 64, 3, 3, device=d)
w1 = torch.randn(256, 64, 1, 1, device=d)
rm = torch.zeros(64, device=d); rv = torch.ones(64, device=d); g = torch.ones(64, device=d); b = torch.zeros(64, device=d)
xg = x.clone().requires_grad_(); wg = w.clone().requires_grad_()
yg = F.conv2d(xg, wg, padding=1); go = torch.ones_like(yg)
cases = {
 "conv3x3": lambda: F.conv2d(x, w, padding=1),
 "conv1x1": lambda: F.conv2d(x, w1),
 "bn train": lambda: F.batch_norm(x, rm, rv, g, b, training=True),
 "bn eval": lambda: F.batch_norm(x, rm, rv, g, b, training=False),
 "conv bwd": lambda: torch.autograd.grad(yg, (xg, wg), go, retain_graph=True),
 "empty": lambda: torch.empty(2, 64, 8, 8, device=d),
 "a+b": lambda: x + x,
}
N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
for name, f in cases.items():
    for _ in range(20): f()
    torch.opencl.synchronize()
    best = 1e9
    for r in range(5):
        t = time.perf_counter()
        for _ in range(N): f()
        h = (time.perf_counter() - t) / N * 1e6
        torch.opencl.synchronize()
        best = min(best, h)
    print(f"{name:10s} host {best:8.1f} us")
if len(sys.argv) > 2:
    import cProfile, pstats
    f = cases[sys.argv[2]]
    pr = cProfile.Profile(); pr.enable()
    for _ in range(N): f()
    pr.disable(); torch.opencl.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(35)
