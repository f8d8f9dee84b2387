package unixhttp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve answers on a unix socket in a temp dir until the test ends.
func serve(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func TestDoRoundTripsJSON(t *testing.T) {
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/json" || r.URL.Path != "/v1/x" {
			http.Error(w, `{"error":"bad request shape"}`, http.StatusBadRequest)
			return
		}
		_, _ = w.Write([]byte(`{"echo":"` + r.Method + `"}`))
	})
	var out struct{ Echo string }
	if err := New(sock, "thing", 5*time.Second).Do(context.Background(), http.MethodPut, "/v1/x", map[string]int{"a": 1}, &out); err != nil {
		t.Fatal(err)
	}
	if out.Echo != http.MethodPut {
		t.Fatalf("decoded %+v, want echo PUT", out)
	}
}

func TestDoErrorsNameMethodAndPath(t *testing.T) {
	sock := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/gone":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":"not the source"}`))
		case "/plain":
			http.Error(w, "plain text", http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(`{not json`))
		}
	})
	c := New(sock, "control plane", 5*time.Second)
	ctx := context.Background()
	var se *StatusError
	err := c.Do(ctx, http.MethodPost, "/gone", nil, nil)
	if !errors.As(err, &se) || se.Status != http.StatusConflict || se.Message != "not the source" {
		t.Fatalf("409: got %v, want a StatusError 409 with the body's error", err)
	}
	if want := "control plane POST /gone: 409: not the source"; err.Error() != want {
		t.Fatalf("409 error %q, want %q", err, want)
	}
	if err := c.Do(ctx, http.MethodGet, "/plain", nil, nil); !errors.As(err, &se) || se.Message != "plain text" {
		t.Fatalf("500 without a JSON error: got %v, want the body as the message", err)
	}
	var out map[string]any
	if err := c.Do(ctx, http.MethodGet, "/bad", nil, &out); err == nil || !strings.HasPrefix(err.Error(), "control plane GET /bad: decode:") {
		t.Fatalf("undecodable answer: got %v, want it wrapped with the method and path", err)
	}
	dead := New(filepath.Join(t.TempDir(), "none.sock"), "agent", time.Second)
	if err := dead.Do(ctx, http.MethodGet, "/v1/vms", nil, nil); err == nil || !strings.HasPrefix(err.Error(), "agent GET /v1/vms: ") {
		t.Fatalf("no server: got %v, want the dial error wrapped with the method and path", err)
	}
}
