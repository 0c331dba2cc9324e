package tiervm

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
)

// A stand-in for the service's HTTP surface (the end-to-end test runs the
// real one): it records the method and path of each request.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return New(sock)
}

func TestCreatePostOrPut(t *testing.T) {
	var got []string
	var body map[string]any
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"x","state":"starting"}`))
	})
	spec := Spec{Image: "memcheck", Mem: 1 << 30, Fast: &FastRequest{Min: 0}, Labels: map[string]string{"a": "b"}}
	if _, err := c.Create(context.Background(), false, "k8s-abc", spec); err != nil {
		t.Fatal(err)
	}
	if _, ok := body["labels"]; ok {
		t.Fatal("labels sent to a service without them")
	}
	if f := body["fast"].(map[string]any); f["min"] != float64(0) {
		t.Fatalf("fast.min 0 must be sent: %v", body)
	}
	if _, err := c.Create(context.Background(), true, "k8s-abc", spec); err != nil {
		t.Fatal(err)
	}
	if body["labels"] == nil {
		t.Fatal("labels not sent to a named service")
	}
	if got[0] != "POST /v1/vms" || got[1] != "PUT /v1/vms/k8s-abc" {
		t.Fatalf("%v", got)
	}
}

func TestErrors(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/vms/gone":
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"code":"not_found","message":"no VM gone"}`))
		default:
			w.WriteHeader(409)
			_, _ = w.Write([]byte(`{"code":"conflict","message":"fast min 1G does not fit","fix":"grow the pool"}`))
		}
	})
	if _, err := c.Get(context.Background(), "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("404: %v", err)
	}
	if err := c.Delete(context.Background(), "gone"); err != nil {
		t.Fatalf("deleting what is gone is done: %v", err)
	}
	_, err := c.Create(context.Background(), false, "", Spec{Image: "memcheck"})
	if !IsConflict(err) || err.Error() != "tiervm service: 409 conflict: fast min 1G does not fit (grow the pool)" {
		t.Fatalf("409: %v", err)
	}
}

func TestHostNamed(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"version":"0.1.0","emulated":true,"boot_id":"b1","pools":[{"tier":"fast","node":0,"capacity_bytes":2},{"tier":"slow","node":1,"capacity_bytes":3}]}`))
	})
	h, err := c.Host(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !h.Named() {
		t.Fatal("a service with a boot id has names")
	}
	if p, ok := h.Pool("slow"); !ok || p.Node != 1 || p.CapacityBytes != 3 {
		t.Fatalf("%+v", p)
	}
}

// A 504 worker_timeout (the service: "retry") is retried for an idempotent
// request, a bounded number of times; a POST create is never sent twice.
func TestWorkerTimeoutRetried(t *testing.T) {
	fails := map[string]int{"GET /v1/vms/slow": 2, "GET /v1/vms/stuck": 100, "POST /v1/vms": 1}
	tries := map[string]int{}
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		k := r.Method + " " + r.URL.Path
		tries[k]++
		if tries[k] <= fails[k] {
			w.WriteHeader(504)
			_, _ = w.Write([]byte(`{"code":"worker_timeout","message":"VM slow's process did not answer within 2.0 s","fix":"retry"}`))
			return
		}
		_, _ = w.Write([]byte(`{"id":"slow","state":"running"}`))
	})
	if _, err := c.Get(context.Background(), "slow"); err != nil || tries["GET /v1/vms/slow"] != 3 {
		t.Fatalf("two 504s then an answer: %v after %d tries", err, tries["GET /v1/vms/slow"])
	}
	if _, err := c.Get(context.Background(), "stuck"); !IsWorkerTimeout(err) || tries["GET /v1/vms/stuck"] != timeoutRetries+1 {
		t.Fatalf("a 504 that lasts: %v after %d tries", err, tries["GET /v1/vms/stuck"])
	}
	if _, err := c.Create(context.Background(), false, "", Spec{Image: "memcheck"}); !IsWorkerTimeout(err) || tries["POST /v1/vms"] != 1 {
		t.Fatalf("a POST is not retried: %v after %d tries", err, tries["POST /v1/vms"])
	}
}

// Remove waits out 504s and a stopping VM until the VM is gone.
func TestRemoveWaitsOutWorkerTimeouts(t *testing.T) {
	gets := 0
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet:
			gets++
			switch {
			case gets <= 6:
				w.WriteHeader(504)
				_, _ = w.Write([]byte(`{"code":"worker_timeout","message":"slow"}`))
			case gets <= 8:
				_, _ = w.Write([]byte(`{"id":"v","state":"stopping"}`))
			default:
				w.WriteHeader(404)
			}
		default:
			w.WriteHeader(202)
		}
	})
	if err := c.Remove(context.Background(), "v"); err != nil || gets != 9 {
		t.Fatalf("Remove: %v after %d GETs", err, gets)
	}
}
