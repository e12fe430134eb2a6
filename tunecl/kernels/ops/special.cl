// special.cl — special functions the pointwise expressions call, by torch's CPU algorithms in float
// (aten/src/ATen/native/Math.h: calc_erfinv, calc_digamma, calc_trigamma), their reflections' arguments
// reduced exactly. Compiled in front of pointwise.cl only for the kernels whose expression uses one, so
// every other kernel keeps its source.

// erfinv: a rational approximation in the central range and in the tails, then two Newton steps.
inline float tcl_erfinv(const float y)
{
  const float y_abs = fabs(y);
  if (y_abs > 1.0f) return NAN;
  if (y_abs == 1.0f) return copysign(INFINITY, y);
  float x;
  if (y_abs <= 0.7f) {
    const float z = y * y;
    const float num = ((-0.140543331f * z + 0.914624893f) * z + -1.645349621f) * z + 0.886226899f;
    const float dem = (((0.012229801f * z + -0.329097515f) * z + 1.442710462f) * z + -2.118377725f) * z + 1.0f;
    x = y * num / dem;
  } else {
    const float z = sqrt(-log((1.0f - y_abs) / 2.0f));
    const float num = ((1.641345311f * z + 3.429567803f) * z + -1.624906493f) * z + -1.970840454f;
    const float dem = (1.637067800f * z + 3.543889200f) * z + 1.0f;
    x = copysign(num, y) / dem;
  }
  const float two_over_sqrt_pi = 1.12837916709551257390f;
  x = x - (erf(x) - y) / (two_over_sqrt_pi * exp(-x * x));
  x = x - (erf(x) - y) / (two_over_sqrt_pi * exp(-x * x));
  return x;
}

// digamma: the reflection below 0, the recurrence up to 10, then the asymptotic series.
inline float tcl_digamma(float x)
{
  const float PSI_10 = 2.25175258906672110764f;
  if (x == 0.0f) return copysign(INFINITY, -x);
  float result = 0.0f;
  if (x < 0.0f) {
    if (x == trunc(x)) return NAN;
    // tan(pi x) = tan(pi r) for r = x - rint(x), exact and in [-1/2, 1/2]: accurate near the poles, where
    // torch's kernel takes the fractional part in double
    const float r = x - rint(x);
    result = -(M_PI_F / tan(M_PI_F * r));
    x = 1.0f - x;
  }
  while (x < 10.0f) {
    result -= 1.0f / x;
    x += 1.0f;
  }
  if (x == 10.0f) return result + PSI_10;
  float y = 0.0f;
  if (x < 1.0e17f) {
    const float z = 1.0f / (x * x);
    y = z * ((((((8.33333333333333333333E-2f * z + -2.10927960927960927961E-2f) * z + 7.57575757575757575758E-3f) * z
                + -4.16666666666666666667E-3f) * z + 3.96825396825396825397E-3f) * z + -8.33333333333333333333E-3f) * z
             + 8.33333333333333333333E-2f);
  }
  return result + log(x) - (0.5f / x) - y;
}

// trigamma (polygamma of order 1): the reflection below 1/2, six steps of the recurrence, the series.
inline float tcl_trigamma(float x)
{
  float sign = 1.0f, result = 0.0f;
  if (x < 0.5f) {
    sign = -1.0f;
    const float sin_pi_x = sin(M_PI_F * (x - rint(x)));   // sin^2(pi x) has period 1: reduced exactly
    result -= (M_PI_F * M_PI_F) / (sin_pi_x * sin_pi_x);
    x = 1.0f - x;
  }
  for (int i = 0; i < 6; ++i) {
    result += 1.0f / (x * x);
    x += 1.0f;
  }
  const float ixx = 1.0f / (x * x);
  result += (1.0f + 1.0f / (2.0f * x) + ixx * (1.0f / 6.0f - ixx * (1.0f / 30.0f - ixx * (1.0f / 42.0f)))) / x;
  return sign * result;
}
