package driver

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

// slowStopService stands in for a named tiervm service (the end-to-end test
// runs the real one) whose one VM stays "stopping" after a DELETE until the
// test lets it end: a VM process inside a slow kernel call.
type slowStopService struct {
	mu      sync.Mutex
	state   string // "running", "stopping", "stopped", "" (gone)
	labels  map[string]string
	creates int
	stopped chan struct{} // closed at the first DELETE of the running VM
	startAs string        // the state a created VM starts in ("" for running)
	// conflict makes the next create a 409 (the service's refusal), after
	// which the VM is in that state ("" for none: a refusal for capacity).
	conflict *string
}

func (s *slowStopService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vm := func() {
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "k8s-vm", "state": s.state, "image": "memcheck", "labels": s.labels})
	}
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/host":
		_, _ = w.Write([]byte(`{"boot_id":"b1","pools":[{"tier":"fast","capacity_bytes":1073741824},{"tier":"slow","capacity_bytes":1073741824}]}`))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/vms":
		_, _ = w.Write([]byte(`[]`))
	case (r.Method == http.MethodPost || r.Method == http.MethodPut) && s.conflict != nil:
		s.state, s.conflict = *s.conflict, nil
		w.WriteHeader(409)
		_, _ = w.Write([]byte(`{"code":"conflict","message":"refused","fix":"-"}`))
	case r.Method == http.MethodPost || r.Method == http.MethodPut:
		s.creates++
		w.WriteHeader(201)
		s.state = "running"
		if s.startAs != "" {
			s.state = s.startAs
		}
		vm()
	case s.state == "":
		w.WriteHeader(404)
		_, _ = w.Write([]byte(`{"code":"not_found","message":"no such VM"}`))
	case r.Method == http.MethodGet:
		vm()
	case r.Method == http.MethodDelete && (s.state == "running" || s.state == "starting"):
		s.state = "stopping"
		close(s.stopped)
		w.WriteHeader(202)
		vm()
	case r.Method == http.MethodDelete && s.state == "stopped":
		s.state = ""
		w.WriteHeader(204)
	default: // DELETE while stopping: already asked
		w.WriteHeader(202)
		vm()
	}
}

func (s *slowStopService) set(state string) {
	s.mu.Lock()
	s.state = state
	s.mu.Unlock()
}

func (s *slowStopService) end() {
	s.mu.Lock()
	s.state = "stopped"
	s.mu.Unlock()
}

// An unprepare whose VM is slow to stop holds no lock while it waits: a
// reconciliation round runs meanwhile, and neither it nor a later round
// creates the VM again once it has stopped; the unprepare then succeeds
// and the entry is gone.
func TestUnprepareOfASlowStoppingVM(t *testing.T) {
	d, svc, c := standInDriver(t, "running", "")
	d.state.Entries[c.UID] = preparedEntry(c)
	done := unprepareInBackground(d, c)
	select {
	case <-svc.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the unprepare did not ask the service to stop the VM")
	}
	boundedRound(t, d, "round while the VM stops")
	if e := d.Snapshot()[c.UID]; e.Phase != PhaseUnpreparing {
		t.Fatalf("entry while its VM stops: %+v", e)
	}
	if f, _ := d.ours(); f != 0 {
		t.Fatalf("an unpreparing claim's fast min is still counted as the driver's: %d", f)
	}
	svc.end()
	boundedRound(t, d, "round after the VM stopped")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("unprepare: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the unprepare did not end once the VM was gone")
	}
	if len(d.Snapshot()) != 0 || svc.creates != 0 {
		t.Fatalf("after the unprepare: entries %v, VMs created %d (want none)", d.Snapshot(), svc.creates)
	}
	if _, err := d.prepare(context.Background(), c); err != nil || svc.creates != 1 {
		t.Fatalf("a new prepare of the claim after the unprepare: %v (VMs created: %d)", err, svc.creates)
	}
}

// standInDriver is a driver on a stand-in service whose one VM is in
// state (created VMs start in startAs; "" for running), for the claim it
// returns.
func standInDriver(t *testing.T, state, startAs string) (*Driver, *slowStopService, *resourceapi.ResourceClaim) {
	c := claim("node-a", 16*mi, 256*mi, "")
	svc := &slowStopService{state: state, stopped: make(chan struct{}), startAs: startAs,
		labels: map[string]string{LabelPrefix + "claim-uid": string(c.UID)}}
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: svc}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	d, err := New(Config{NodeName: "node-a", StateDir: t.TempDir(), StartTimeout: 20 * time.Second}, fake.NewClientset(c), tiervm.New(sock))
	if err != nil {
		t.Fatal(err)
	}
	close(d.firstRound)
	return d, svc, c
}

// slowStartDriver: a stand-in service with no VM yet, whose created VM
// stays "starting" until the test sets it running.
func slowStartDriver(t *testing.T) (*Driver, *slowStopService, *resourceapi.ResourceClaim) {
	return standInDriver(t, "", "starting")
}

// preparedEntry is the checkpoint entry of c prepared with the stand-in
// service's VM.
func preparedEntry(c *resourceapi.ResourceClaim) *Entry {
	return &Entry{ClaimUID: c.UID, Namespace: c.Namespace, Name: c.Name, Phase: PhasePrepared,
		VMName: "k8s-vm", VMID: "k8s-vm", BootID: "b1", Spec: tiervm.Spec{Image: "memcheck", Mem: 256 * mi, Fast: &tiervm.FastRequest{Min: 16 * mi}}}
}

// unprepareInBackground runs an unprepare of c and returns its result
// channel.
func unprepareInBackground(d *Driver, c *resourceapi.ResourceClaim) chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: c.UID}})
		if err == nil {
			err = out[c.UID]
		}
		done <- err
	}()
	return done
}

// prepareInBackground runs a prepare of c and returns its result channel,
// once the service has created the VM.
func prepareInBackground(t *testing.T, d *Driver, svc *slowStopService, c *resourceapi.ResourceClaim) chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
		defer cancel()
		out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		if err == nil {
			err = out[c.UID].Err
		}
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		svc.mu.Lock()
		n := svc.creates
		svc.mu.Unlock()
		if n == 1 {
			return done
		}
		if time.Now().After(deadline) {
			t.Fatal("the prepare did not ask the service for the VM")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// boundedRound runs one reconciliation round, failing the test if it
// waits on a VM (more than 3 s).
func boundedRound(t *testing.T, d *Driver, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r := make(chan error, 1)
	go func() { r <- d.Reconcile(ctx) }()
	select {
	case err := <-r:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("%s: a reconciliation round waited on a VM (more than 3 s)", what)
	}
}

// A prepare whose VM is slow to start holds no lock while it waits: a
// reconciliation round runs meanwhile (counting the starting VM's
// reservation as the driver's), and the prepare succeeds once the VM runs.
func TestPrepareOfASlowStartingVM(t *testing.T) {
	d, svc, c := slowStartDriver(t)
	done := prepareInBackground(t, d, svc, c)
	boundedRound(t, d, "round while the VM starts")
	if e := d.Snapshot()[c.UID]; e.Phase != PhaseCreating || e.VMID != "k8s-vm" {
		t.Fatalf("entry while its VM starts: %+v", e)
	}
	if f, _ := d.ours(); f != 16*mi {
		t.Fatalf("a starting VM's fast min is not counted as the driver's: %d", f)
	}
	svc.set("running")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("prepare: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the prepare did not end once the VM ran")
	}
	if e := d.Snapshot()[c.UID]; e.Phase != PhasePrepared || svc.creates != 1 {
		t.Fatalf("after the prepare: %+v, VMs created %d", e, svc.creates)
	}
}

// An unprepare that comes while the claim's VM still starts (the kubelet
// gave up on the prepare) is not held behind it, and the prepare then fails
// instead of recording a claim that is gone.
func TestUnprepareDuringASlowStart(t *testing.T) {
	d, svc, c := slowStartDriver(t)
	done := prepareInBackground(t, d, svc, c)
	un := unprepareInBackground(d, c)
	select {
	case <-svc.stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the unprepare did not ask the service to stop the starting VM")
	}
	svc.end()
	for _, w := range []struct {
		what string
		ch   chan error
		ok   bool
	}{{"unprepare", un, true}, {"prepare", done, false}} {
		select {
		case err := <-w.ch:
			if (err == nil) != w.ok {
				t.Fatalf("%s: %v", w.what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s did not end once the VM was gone", w.what)
		}
	}
	if len(d.Snapshot()) != 0 {
		t.Fatalf("entries left: %v", d.Snapshot())
	}
}

// A prepared claim whose VM the service lost gets it created again by a
// reconciliation round that does not wait for it to run; the claim stays
// prepared meanwhile and the next rounds create nothing more.
func TestRecreateDoesNotWaitForTheVMToRun(t *testing.T) {
	d, svc, c := slowStartDriver(t)
	d.state.Entries[c.UID] = preparedEntry(c)
	d.state.Entries[c.UID].VMPid = 4242
	boundedRound(t, d, "round that recreates the VM")
	e := d.Snapshot()[c.UID]
	if svc.creates != 1 || e.Phase != PhasePrepared || e.Recreated != 1 || e.VMPid != 0 {
		t.Fatalf("after the recreating round: %+v, VMs created %d", e, svc.creates)
	}
	boundedRound(t, d, "round while the recreated VM starts")
	svc.set("running")
	boundedRound(t, d, "round once it runs")
	if e := d.Snapshot()[c.UID]; svc.creates != 1 || e.Phase != PhasePrepared || e.Recreated != 1 {
		t.Fatalf("after the VM ran: %+v, VMs created %d", e, svc.creates)
	}
}

// A prepare whose kubelet call ends (its deadline) while the VM still
// starts leaves the VM and the entry for the kubelet's retry, which waits
// for that VM instead of creating another.
func TestAPrepareRetriedAfterTheKubeletsDeadlineWaitsForTheSameVM(t *testing.T) {
	d, svc, c := slowStartDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := d.prepare(ctx, c)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "still starting when the kubelet's call ended") {
		t.Fatalf("prepare past the kubelet's deadline: %v", err)
	}
	if e := d.Snapshot()[c.UID]; e.Phase != PhaseCreating || svc.state != "starting" {
		t.Fatalf("after the deadline: entry %+v, VM %q", e, svc.state)
	}
	done := prepareInBackground(t, d, svc, c)
	svc.set("running")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the retry: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retry did not end once the VM ran")
	}
	if e := d.Snapshot()[c.UID]; e.Phase != PhasePrepared || svc.creates != 1 {
		t.Fatalf("after the retry: %+v, VMs created %d (want 1)", e, svc.creates)
	}
}

// A prepare whose VM name is held by an earlier VM of the claim (stopping,
// or created meanwhile) fails with that VM's state for the kubelet to
// retry, not as a claim the node cannot honour; a 409 with no VM of the
// name is one. Once the earlier VM has ended, a prepare creates the VM.
func TestAPrepareWhoseVMNameIsStillHeld(t *testing.T) {
	running, none := "running", ""
	for _, tc := range []struct {
		what     string
		state    string  // the name's VM before the prepare ("" none)
		conflict *string // the create's 409, then the name's VM state
		want     string
	}{
		{"an earlier VM still stopping", "stopping", nil, "still held by VM k8s-vm (stopping)"},
		{"a VM of the name created meanwhile", "", &running, "still held by VM k8s-vm (running)"},
		{"a refusal for capacity", "", &none, "cannot honour claim"},
	} {
		d, svc, c := standInDriver(t, tc.state, "")
		svc.conflict = tc.conflict
		_, err := d.prepare(context.Background(), c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: prepare: %v (want %q)", tc.what, err, tc.want)
		}
		if tc.want != "cannot honour claim" && strings.Contains(err.Error(), "cannot honour") {
			t.Fatalf("%s: reported as a claim the node cannot honour: %v", tc.what, err)
		}
		if len(d.Snapshot()) != 0 || svc.creates != 0 {
			t.Fatalf("%s: after the failed prepare: entries %v, VMs created %d", tc.what, d.Snapshot(), svc.creates)
		}
		svc.end()
		if _, err := d.prepare(context.Background(), c); err != nil || svc.creates != 1 {
			t.Fatalf("%s: a prepare once the VM ended: %v (VMs created: %d)", tc.what, err, svc.creates)
		}
	}
}
