// Package tiervm is the DRA driver's client of one node's `tiervm serve`
// (REST over a Unix socket, docs/service.md). It is the only place that knows
// the service's API; the driver sees Host, VM, Spec and the errors below.
//
// Two generations of the API are handled:
//   - the service of this branch: VMs created by POST /v1/vms get a generated
//     id (vm-N) that restarts at vm-1 when the service restarts, so a VM is
//     recognised by its id together with the worker's pid;
//   - the service with durable identity (issue 32): GET /v1/host has a
//     boot_id, and PUT /v1/vms/{name} creates a client-named VM idempotently,
//     with labels. Client.Named reports which one the socket speaks, and
//     Create uses PUT with the given name when it can.
package tiervm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Pool is one tier's pool as GET /v1/host reports it.
type Pool struct {
	Tier           string `json:"tier"`
	Node           int    `json:"node"`
	CapacityBytes  int64  `json:"capacity_bytes"`
	ReservedBytes  int64  `json:"reserved_bytes"`
	CommittedBytes int64  `json:"committed_bytes"`
	FreeBytes      int64  `json:"free_bytes"`
}

// Host is GET /v1/host.
type Host struct {
	Version      string   `json:"version"`
	Emulated     bool     `json:"emulated"`
	Pools        []Pool   `json:"pools"`
	VMIDs        []string `json:"vm_ids"`
	ShuttingDown bool     `json:"shutting_down"`
	// BootID is set by services with durable identity (issue 32): a new
	// UUID at every start of the service.
	BootID string `json:"boot_id,omitempty"`
}

// Pool returns the pool of a tier ("fast", "slow").
func (h *Host) Pool(tier string) (Pool, bool) {
	for _, p := range h.Pools {
		if p.Tier == tier {
			return p, true
		}
	}
	return Pool{}, false
}

// FastInfo is the part of a VM's fast share the driver reads.
type FastInfo struct {
	MinBytes    int64   `json:"min_bytes"`
	MaxBytes    int64   `json:"max_bytes"`
	Weight      float64 `json:"weight"`
	TargetBytes int64   `json:"target_bytes"`
}

// VM is GET /v1/vms/{id}, the fields the driver reads.
type VM struct {
	ID       string            `json:"id"`
	State    string            `json:"state"`
	Image    string            `json:"image"`
	MemBytes int64             `json:"mem_bytes"`
	Pid      *int              `json:"pid"`
	Fast     FastInfo          `json:"fast"`
	Error    *string           `json:"error"`
	Labels   map[string]string `json:"labels,omitempty"`
	BootID   string            `json:"boot_id,omitempty"`
	UUID     string            `json:"uuid,omitempty"`
}

// Alive says whether the VM is starting or running (not asked to stop, not
// ended).
func (v *VM) Alive() bool { return v.State == "starting" || v.State == "running" }

// Ended says whether the VM's process is gone (its record may remain).
func (v *VM) Ended() bool {
	switch v.State {
	case "stopped", "crashed", "failed", "lost":
		return true
	}
	return false
}

// PidOf returns the worker's pid, 0 if none.
func (v *VM) PidOf() int {
	if v.Pid == nil {
		return 0
	}
	return *v.Pid
}

// FastRequest is the create body's fast share.
type FastRequest struct {
	Min    int64   `json:"min"`
	Max    int64   `json:"max,omitempty"`
	Weight float64 `json:"weight,omitempty"`
}

// Spec is the body of a create (POST /v1/vms, PUT /v1/vms/{name}).
type Spec struct {
	Image  string   `json:"image"`
	Args   []string `json:"args,omitempty"`
	Mem    int64    `json:"mem,omitempty"`
	VCPUs  int      `json:"vcpus,omitempty"`
	Policy string   `json:"policy,omitempty"`
	// Tracking is the access tracking ("hint-faults", "off").
	Tracking string            `json:"tracking,omitempty"`
	Fast     *FastRequest      `json:"fast,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// APIError is the service's error body with its HTTP status.
type APIError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Fix     string `json:"fix"`
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("tiervm service: %d %s: %s", e.Status, e.Code, e.Message)
	if e.Fix != "" {
		s += " (" + e.Fix + ")"
	}
	return s
}

// ErrNotFound is a 404 from the service.
var ErrNotFound = errors.New("tiervm service: no such VM")

// IsConflict says whether err is the service's 409 (the min or mem does not
// fit, or a name taken by another request).
func IsConflict(err error) bool {
	var a *APIError
	return errors.As(err, &a) && a.Status == http.StatusConflict
}

// Client talks to one service over its Unix socket.
type Client struct {
	socket string
	http   *http.Client
}

// New returns a client of the service listening on socket.
func New(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns:    4,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{socket: socket, http: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

// Socket is the service's socket path.
func (c *Client) Socket() string { return c.socket }

// Retries of an idempotent request the service answered with 504
// worker_timeout (a VM's process slow to answer: the service says to
// retry), and the pause before each.
const (
	timeoutRetries = 4
	retryPause     = 250 * time.Millisecond
)

// IsWorkerTimeout says whether err is the service's 504 worker_timeout: a
// VM's process did not answer in time, and the request may be retried.
func IsWorkerTimeout(err error) bool {
	var a *APIError
	return errors.As(err, &a) && a.Status == http.StatusGatewayTimeout && a.Code == "worker_timeout"
}

// idempotent says whether a repeat of the request has the effect of one:
// every method the client sends but POST (a create without a name).
func idempotent(method string) bool { return method != http.MethodPost }

// do sends one request; an idempotent one answered with 504
// worker_timeout is sent again, at most timeoutRetries more times and
// never past ctx.
func (c *Client) do(ctx context.Context, method, path string, body, out any) (int, error) {
	for try := 0; ; try++ {
		status, err := c.doOnce(ctx, method, path, body, out)
		if try == timeoutRetries || !idempotent(method) || !IsWorkerTimeout(err) {
			return status, err
		}
		select {
		case <-ctx.Done():
			return status, err
		case <-time.After(retryPause):
		}
	}
}

func (c *Client) doOnce(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://tiervm"+path, rd)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("tiervm service at %s: %w", c.socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return resp.StatusCode, ErrNotFound
	}
	if resp.StatusCode >= 300 {
		ae := &APIError{Status: resp.StatusCode}
		if json.Unmarshal(data, ae) != nil || ae.Message == "" {
			ae.Message = strings.TrimSpace(string(data))
		}
		return resp.StatusCode, ae
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, fmt.Errorf("tiervm service: %s %s: %w", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// Host is GET /v1/host.
func (c *Client) Host(ctx context.Context) (*Host, error) {
	var h Host
	if _, err := c.do(ctx, http.MethodGet, "/v1/host", nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Named says whether the service creates client-named VMs with labels
// (PUT /v1/vms/{name}, issue 32): it has a boot id.
func (h *Host) Named() bool { return h.BootID != "" }

// Create creates a VM. With a service that has names (named true) it is
// PUT /v1/vms/{name}, idempotent: a repeat of the same request answers the
// VM that exists. Otherwise it is POST /v1/vms and the labels are dropped
// (that service has none).
func (c *Client) Create(ctx context.Context, named bool, name string, spec Spec) (*VM, error) {
	var vm VM
	if named {
		if _, err := c.do(ctx, http.MethodPut, "/v1/vms/"+url.PathEscape(name), spec, &vm); err != nil {
			return nil, err
		}
		return &vm, nil
	}
	spec.Labels = nil
	if _, err := c.do(ctx, http.MethodPost, "/v1/vms", spec, &vm); err != nil {
		return nil, err
	}
	return &vm, nil
}

// Get is GET /v1/vms/{id}; ErrNotFound when there is none.
func (c *Client) Get(ctx context.Context, id string) (*VM, error) {
	var vm VM
	if _, err := c.do(ctx, http.MethodGet, "/v1/vms/"+url.PathEscape(id), nil, &vm); err != nil {
		return nil, err
	}
	return &vm, nil
}

// List is GET /v1/vms.
func (c *Client) List(ctx context.Context) ([]VM, error) {
	var vms []VM
	if _, err := c.do(ctx, http.MethodGet, "/v1/vms", nil, &vms); err != nil {
		return nil, err
	}
	return vms, nil
}

// Delete is DELETE /v1/vms/{id}: a running VM is asked to stop (202), an
// ended one is removed (204). A VM that is not there is no error.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/v1/vms/"+url.PathEscape(id), nil, nil)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	return err
}

// RemoveBound bounds a Remove whose ctx has no deadline: the service stops
// a VM within its stop grace (10 s) and then kills it.
const RemoveBound = 60 * time.Second

// Remove stops a VM and removes its record, waiting for the stop (bounded
// by ctx, and by RemoveBound when ctx has no deadline): DELETE, poll until
// it ended, DELETE again. A 504 worker_timeout on the way is waited out.
func (c *Client) Remove(ctx context.Context, id string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, RemoveBound)
		defer cancel()
	}
	state := "unknown"
	for {
		vm, err := c.Get(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil
		case err == nil:
			state = vm.State
			if vm.State != "stopping" {
				err = c.Delete(ctx, id)
			}
		}
		if err != nil && !IsWorkerTimeout(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("VM %s still %s: %w", id, state, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// PatchPools is PATCH /v1/host: new pool sizes ("" leaves one as it is).
func (c *Client) PatchPools(ctx context.Context, fast, slow string) (*Host, error) {
	body := map[string]string{}
	if fast != "" {
		body["fast_pool"] = fast
	}
	if slow != "" {
		body["slow_pool"] = slow
	}
	var h Host
	if _, err := c.do(ctx, http.MethodPatch, "/v1/host", body, &h); err != nil {
		return nil, err
	}
	return &h, nil
}
