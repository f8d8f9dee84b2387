package reports

import "testing"

func TestNiceSteps(t *testing.T) {
	for raw, want := range map[float64]float64{510: 1000, 0.3: 0.5, 100: 100, 101: 200, 2500: 5000} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
	for raw, want := range map[float64]float64{510: 500, 0.3: 0.2, 100: 100, 199: 100, 2500: 2000} {
		if got := niceStepDown(raw); got != want {
			t.Errorf("niceStepDown(%v) = %v, want %v", raw, got, want)
		}
	}
}
