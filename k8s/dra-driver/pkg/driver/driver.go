// Package driver is tiervm's DRA driver for one node: it publishes the node's
// tiervm pools as a ResourceSlice, prepares a claim by creating a VM through
// the node's `tiervm serve` and unprepares it by deleting the VM, and
// reconciles its checkpoint with the API server and the service.
package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

// Names the driver publishes.
const (
	// DefaultDriverName is the DRA driver name (a DNS subdomain).
	DefaultDriverName = "memory.tiervm.dev"
	// FastDevice and SlowDevice are the two devices of a node's pool.
	FastDevice = "fast"
	SlowDevice = "slow"
	// CapacityMemory is the consumable capacity of both devices, in bytes.
	CapacityMemory = resourceapi.QualifiedName("memory")
	// Step is the granularity of amounts: the service's sizes are multiples
	// of 2 MiB.
	Step = 2 << 20
	// LabelPrefix prefixes the labels the driver gives a VM.
	LabelPrefix = "tiervm.dev/"
)

// Config of a driver instance.
type Config struct {
	DriverName string
	NodeName   string
	// StateDir holds the checkpoint.
	StateDir string
	// Interval between reconciliations (pools, VMs, claims).
	Interval time.Duration
	// StartTimeout bounds the wait for a VM to run in a prepare.
	StartTimeout time.Duration
	// Defaults for what a claim's opaque configuration leaves out.
	Defaults VMConfig
}

// VMConfig is the opaque configuration a claim or DeviceClass gives this
// driver (DeviceClaimConfiguration.opaque.parameters), the VM's spec beyond
// the amounts of memory the claim requests.
type VMConfig struct {
	APIVersion string   `json:"apiVersion,omitempty"`
	Kind       string   `json:"kind,omitempty"`
	Image      string   `json:"image,omitempty"`
	Args       []string `json:"args,omitempty"`
	VCPUs      int      `json:"vcpus,omitempty"`
	Policy     string   `json:"policy,omitempty"`
	// Tracking is the VM's access tracking: "hint-faults" (the default:
	// the division of spare fast capacity needs it) or "off".
	Tracking string `json:"tracking,omitempty"`
	// FastMax caps the VM's fast share (a quantity; default: its mem).
	FastMax string  `json:"fastMax,omitempty"`
	Weight  float64 `json:"weight,omitempty"`
	// Mem is the VM's memory when the claim requests no slow memory.
	Mem string `json:"mem,omitempty"`
}

func (c *VMConfig) merge(o VMConfig) {
	if o.Image != "" {
		c.Image = o.Image
	}
	if o.Args != nil {
		c.Args = o.Args
	}
	if o.VCPUs != 0 {
		c.VCPUs = o.VCPUs
	}
	if o.Policy != "" {
		c.Policy = o.Policy
	}
	if o.Tracking != "" {
		c.Tracking = o.Tracking
	}
	if o.FastMax != "" {
		c.FastMax = o.FastMax
	}
	if o.Weight != 0 {
		c.Weight = o.Weight
	}
	if o.Mem != "" {
		c.Mem = o.Mem
	}
}

// Driver implements kubeletplugin.DRAPlugin for one node.
type Driver struct {
	cfg    Config
	kube   kubernetes.Interface
	svc    *tiervm.Client
	helper *kubeletplugin.Helper

	mu        sync.Mutex
	state     *State
	statePath string
	// published is what the ResourceSlice says now (fast, slow capacity).
	published [2]int64
	attrs     string
	// lastHost is the last answer of GET /v1/host (nil: service down).
	lastHost *tiervm.Host
	// firstRound is closed when Run's first reconciliation has ended: the
	// kubelet's calls wait for it (VMs the service lost while the driver
	// was down are back before anything is prepared or unprepared), while
	// the plugin registers at once.
	firstRound     chan struct{}
	firstRoundOnce sync.Once
}

// FirstRoundWait bounds a kubelet call's wait for the first
// reconciliation; past it the call fails and the kubelet retries.
const FirstRoundWait = 60 * time.Second

// New loads the checkpoint and returns a driver; Start runs it.
func New(cfg Config, kube kubernetes.Interface, svc *tiervm.Client) (*Driver, error) {
	if cfg.DriverName == "" {
		cfg.DriverName = DefaultDriverName
	}
	if cfg.Interval == 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(cfg.StateDir, "checkpoint.json")
	st, err := loadState(path)
	if err != nil {
		return nil, err
	}
	return &Driver{cfg: cfg, kube: kube, svc: svc, state: st, statePath: path, published: [2]int64{-1, -1},
		firstRound: make(chan struct{})}, nil
}

// SetHelper gives the driver the kubelet plugin helper it publishes through.
func (d *Driver) SetHelper(h *kubeletplugin.Helper) { d.helper = h }

// Run reconciles every interval until ctx ends. The first round runs at
// once; when it ends (whatever its outcome) the kubelet's calls go ahead.
func (d *Driver) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		if err := d.Reconcile(ctx); err != nil {
			logger.Error(err, "reconcile")
		}
		d.firstRoundOnce.Do(func() { close(d.firstRound) })
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.cfg.Interval):
		}
	}
}

// ---- the kubelet's calls ----

// waitFirstRound waits (bounded by ctx and FirstRoundWait) for Run's first
// reconciliation to end.
func (d *Driver) waitFirstRound(ctx context.Context) error {
	select {
	case <-d.firstRound:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("node %s: the driver's first reconciliation has not ended: %w (the kubelet retries)", d.cfg.NodeName, ctx.Err())
	case <-time.After(FirstRoundWait):
		return fmt.Errorf("node %s: the driver's first reconciliation has not ended after %s: is the tiervm service answering? (the kubelet retries)", d.cfg.NodeName, FirstRoundWait)
	}
}

// PrepareResourceClaims creates (or finds) each claim's VM. The wait for a
// VM to run holds no lock: other claims' prepares and unprepares, and the
// reconciliation, go on meanwhile (a VM can take a minute to start on a
// busy host: docs/results.md, section 10).
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if err := d.waitFirstRound(ctx); err != nil {
		return nil, err
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devs, err := d.prepare(ctx, claim)
		res := kubeletplugin.PrepareResult{Err: err}
		for _, dv := range devs {
			res.Devices = append(res.Devices, kubeletplugin.Device{
				Requests: []string{dv.Request}, PoolName: dv.Pool, DeviceName: dv.Device, ShareID: dv.ShareID,
			})
		}
		out[claim.UID] = res
	}
	return out, nil
}

// prepare asks the service for the claim's VM (under d.mu), waits for it
// to run (holding no lock), then records it as prepared (under d.mu).
func (d *Driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]DeviceRef, error) {
	start := time.Now()
	e, devs, err := d.beginPrepare(ctx, claim)
	if err != nil || e == nil {
		return devs, err
	}
	vm, err := d.awaitRunning(ctx, e.VMID, e.Namespace+"/"+e.Name)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.finishPrepare(claim.UID, e, vm, err); err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("prepared claim", "claim", klog.KObj(claim), "vm", e.VMID, "fastMin", e.FastMin(), "mem", e.Spec.Mem, "took", time.Since(start))
	return devs, nil
}

// beginPrepare checkpoints the claim's entry and asks the service for its
// VM. It returns the entry to wait on, or no entry with the devices of a
// claim prepared already (or an error).
func (d *Driver) beginPrepare(ctx context.Context, claim *resourceapi.ResourceClaim) (*Entry, []DeviceRef, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	host, err := d.svc.Host(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("node %s: tiervm service unavailable: %w", d.cfg.NodeName, err)
	}
	if e, ok := d.state.Entries[claim.UID]; ok {
		switch vm, found := d.findVM(ctx, host, e); {
		case e.Phase == PhaseUnpreparing:
			return nil, nil, fmt.Errorf("node %s: claim %s/%s is being unprepared: its VM %s is still stopping (the kubelet retries)", d.cfg.NodeName, e.Namespace, e.Name, e.VMID)
		case e.Phase == PhasePrepared && found && vm.Alive():
			return nil, e.Devices, nil // idempotent: already prepared
		case e.Phase == PhaseCreating && e.VMID != "" && found && vm.Alive():
			return e, e.Devices, nil // an earlier prepare's VM, still starting
		}
	}
	spec, devs, err := d.specFor(ctx, claim)
	if err != nil {
		return nil, nil, err
	}
	e := &Entry{
		ClaimUID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
		Phase: PhaseCreating, VMName: vmName(claim), Spec: spec, Devices: devs,
	}
	if old, ok := d.state.Entries[claim.UID]; ok {
		e.Recreated = old.Recreated
		if old.VMID != "" && old.VMID != e.VMName {
			_ = d.svc.Delete(ctx, old.VMID)
		}
	}
	d.state.Entries[claim.UID] = e
	if err := d.state.save(d.statePath); err != nil {
		delete(d.state.Entries, claim.UID)
		return nil, nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := d.startVM(ctx, host, e); err != nil {
		delete(d.state.Entries, claim.UID)
		_ = d.state.save(d.statePath)
		return nil, nil, err
	}
	return e, devs, nil
}

// finishPrepare records the outcome of the wait for a prepare's VM. The
// entry may have changed meanwhile: an unprepare began (the kubelet gave
// up on the prepare), or a reconciliation dropped it (its VM ended). The
// caller holds d.mu.
func (d *Driver) finishPrepare(uid types.UID, e *Entry, vm *tiervm.VM, waitErr error) error {
	ours := d.state.Entries[uid] == e && e.Phase != PhaseUnpreparing
	if waitErr != nil {
		if ours && !errors.Is(waitErr, errCallerGone) {
			delete(d.state.Entries, uid)
			_ = d.state.save(d.statePath)
		}
		return waitErr
	}
	if !ours {
		return fmt.Errorf("node %s: claim %s/%s was unprepared while its VM %s started (the kubelet retries)", d.cfg.NodeName, e.Namespace, e.Name, e.VMID)
	}
	e.VMPid = vm.PidOf()
	e.Phase = PhasePrepared
	if err := d.state.save(d.statePath); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// startVM asks the service for the entry's VM, records its id and
// checkpoints; it does not wait for the VM to run. The caller holds d.mu.
func (d *Driver) startVM(ctx context.Context, host *tiervm.Host, e *Entry) error {
	named := host.Named()
	if named {
		// A record of an ended VM of that name (a restart of the service)
		// makes the name's PUT a 409: remove it first. One still stopping
		// (an earlier preparation's) holds the name until it ends.
		if vm, err := d.svc.Get(ctx, e.VMName); err == nil && vm.Ended() {
			_ = d.svc.Remove(ctx, vm.ID)
		} else if err == nil && vm.State == "stopping" {
			return d.nameHeld(e, vm)
		}
	}
	vm, err := d.svc.Create(ctx, named, e.VMName, e.Spec)
	if err != nil {
		if tiervm.IsConflict(err) {
			// The name's VM may have appeared or changed since the Get:
			// then the 409 is about the name, not about capacity.
			if named {
				if old, gerr := d.svc.Get(ctx, e.VMName); gerr == nil {
					return d.nameHeld(e, old)
				}
			}
			return fmt.Errorf("node %s cannot honour claim %s/%s (fast.min %d, mem %d): %w", d.cfg.NodeName, e.Namespace, e.Name, e.FastMin(), e.Spec.Mem, err)
		}
		return fmt.Errorf("node %s: create VM: %w", d.cfg.NodeName, err)
	}
	e.VMID, e.BootID = vm.ID, host.BootID
	if err := d.state.save(d.statePath); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// nameHeld is the error of a prepare whose VM name is still held by vm,
// a VM of an earlier preparation of the claim (stopping, or created under
// another request): the kubelet retries once it has ended.
func (d *Driver) nameHeld(e *Entry, vm *tiervm.VM) error {
	return fmt.Errorf("node %s: claim %s/%s: its VM name %s is still held by VM %s (%s) of an earlier preparation; the kubelet retries once it has ended", d.cfg.NodeName, e.Namespace, e.Name, e.VMName, vm.ID, vm.State)
}

// awaitRunning waits, bounded by StartTimeout, for VM id (of claim, for
// messages) to run; a VM that ended or stops instead is removed, one still
// starting at the bound is deleted. Holds no lock.
func (d *Driver) awaitRunning(ctx context.Context, id, claim string) (*tiervm.VM, error) {
	wctx, cancel := context.WithTimeout(ctx, d.cfg.StartTimeout)
	defer cancel()
	for {
		vm, err := d.svc.Get(wctx, id)
		if err == nil && vm.State == "running" {
			return vm, nil
		}
		if err == nil && (vm.Ended() || vm.State == "stopping") {
			why := vm.State
			if vm.Error != nil {
				why += ": " + *vm.Error
			}
			_ = d.svc.Remove(ctx, vm.ID)
			return nil, fmt.Errorf("node %s: VM %s for claim %s did not start: %s", d.cfg.NodeName, vm.ID, claim, why)
		}
		if errors.Is(err, tiervm.ErrNotFound) {
			return nil, fmt.Errorf("node %s: VM %s vanished while starting", d.cfg.NodeName, id)
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("node %s: VM %s for claim %s was still starting when the kubelet's call ended (%v): it goes on starting, and %w", d.cfg.NodeName, id, claim, ctx.Err(), errCallerGone)
			}
			_ = d.svc.Delete(ctx, id)
			return nil, fmt.Errorf("node %s: VM %s not running after %s", d.cfg.NodeName, id, d.cfg.StartTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errCallerGone: the kubelet's call ended (its deadline) while its VM was
// still starting. The entry and the VM stay for the kubelet's retry.
var errCallerGone = errors.New("the kubelet's retry waits for it")

// specFor derives the VM's spec from the claim's allocation: fast.min is the
// capacity consumed on the fast device, mem the capacity consumed on the
// slow device; the rest from the opaque configuration.
func (d *Driver) specFor(ctx context.Context, claim *resourceapi.ResourceClaim) (tiervm.Spec, []DeviceRef, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var fastMin, mem int64
	var devs []DeviceRef
	for _, r := range alloc.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName {
			return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s: device %s/%s is not on node %s", claim.Namespace, claim.Name, r.Pool, r.Device, d.cfg.NodeName)
		}
		amount := int64(0)
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			amount = q.Value()
		}
		switch r.Device {
		case FastDevice:
			fastMin += amount
		case SlowDevice:
			mem += amount
		default:
			return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s: unknown device %q", claim.Namespace, claim.Name, r.Device)
		}
		devs = append(devs, DeviceRef{Request: r.Request, Pool: r.Pool, Device: r.Device, ShareID: r.ShareID})
	}
	if len(devs) == 0 {
		return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s has no device of driver %s", claim.Namespace, claim.Name, d.cfg.DriverName)
	}
	conf := d.cfg.Defaults
	for _, c := range alloc.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != d.cfg.DriverName {
			continue
		}
		var o VMConfig
		dec := json.NewDecoder(bytes.NewReader(c.Opaque.Parameters.Raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s: opaque configuration: %w", claim.Namespace, claim.Name, err)
		}
		conf.merge(o)
	}
	if mem == 0 {
		q, err := resource.ParseQuantity(conf.Mem)
		if err != nil {
			return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s requests no slow memory and the configuration's mem %q: %w", claim.Namespace, claim.Name, conf.Mem, err)
		}
		mem = q.Value()
	}
	spec := tiervm.Spec{
		Image: conf.Image, Args: conf.Args, Mem: mem, VCPUs: conf.VCPUs, Policy: conf.Policy, Tracking: conf.Tracking,
		Fast: &tiervm.FastRequest{Min: fastMin, Weight: conf.Weight},
	}
	if conf.FastMax != "" {
		q, err := resource.ParseQuantity(conf.FastMax)
		if err != nil {
			return tiervm.Spec{}, nil, fmt.Errorf("claim %s/%s: fastMax: %w", claim.Namespace, claim.Name, err)
		}
		spec.Fast.Max = q.Value()
	}
	spec.Labels = d.labels(ctx, claim)
	return spec, devs, nil
}

// labels: the claim's and the pod's identity, and the pod's own labels.
func (d *Driver) labels(ctx context.Context, claim *resourceapi.ResourceClaim) map[string]string {
	l := map[string]string{
		LabelPrefix + "driver":    d.cfg.DriverName,
		LabelPrefix + "node":      d.cfg.NodeName,
		LabelPrefix + "claim":     claim.Namespace + "/" + claim.Name,
		LabelPrefix + "claim-uid": string(claim.UID),
	}
	for _, r := range claim.Status.ReservedFor {
		if r.Resource != "pods" {
			continue
		}
		l[LabelPrefix+"pod"] = claim.Namespace + "/" + r.Name
		pod, err := d.kube.CoreV1().Pods(claim.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
		if err != nil || pod.UID != r.UID {
			break
		}
		keys := make([]string, 0, len(pod.Labels))
		for k := range pod.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			key := "pod/" + k
			if len(l) >= 32 || len(key) > 63 {
				break
			}
			l[key] = pod.Labels[k]
		}
		break
	}
	return l
}

// vmName is the VM's name with a named service: the claim's namespace and
// name for people, its UID for uniqueness (at most 63 characters).
func vmName(claim *resourceapi.ResourceClaim) string {
	prefix := strings.ToLower(claim.Namespace + "." + claim.Name)
	if len(prefix) > 26 {
		prefix = prefix[:26]
	}
	return prefix + "-" + strings.ToLower(string(claim.UID))
}

// UnprepareResourceClaims deletes each claim's VM (idempotent: a claim the
// driver does not know is done). The wait for a VM to end holds no lock:
// other claims' prepares and the reconciliation go on meanwhile.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	if err := d.waitFirstRound(ctx); err != nil {
		return nil, err
	}
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepare(ctx, c.UID)
	}
	return out, nil
}

// UnprepareWait bounds one unprepare's wait for its VM to end; past it the
// call fails, the kubelet retries, and the entry stays unpreparing.
const UnprepareWait = 30 * time.Second

func (d *Driver) unprepare(ctx context.Context, uid types.UID) error {
	vmID, claim, err := d.beginUnprepare(ctx, uid)
	if err != nil || vmID == "" {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, UnprepareWait)
	err = d.svc.Remove(rctx, vmID)
	cancel()
	if err != nil {
		return fmt.Errorf("node %s: delete VM %s of claim %s: %w (the claim stays unpreparing; the kubelet retries)", d.cfg.NodeName, vmID, claim, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.forget(ctx, uid)
}

// beginUnprepare marks the claim's entry unpreparing and returns its VM's id
// and the claim's namespace/name. The id is "" when there is nothing to
// wait for: no entry, or no VM left (the entry is then dropped too).
func (d *Driver) beginUnprepare(ctx context.Context, uid types.UID) (string, string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.state.Entries[uid]
	if !ok {
		return "", "", nil
	}
	claim := e.Namespace + "/" + e.Name
	host, err := d.svc.Host(ctx)
	if err != nil {
		return "", claim, fmt.Errorf("node %s: tiervm service unavailable: %w", d.cfg.NodeName, err)
	}
	vm, found := d.findVM(ctx, host, e)
	if !found {
		return "", claim, d.forget(ctx, uid)
	}
	if e.Phase != PhaseUnpreparing {
		e.Phase = PhaseUnpreparing
		if err := d.state.save(d.statePath); err != nil {
			return "", claim, fmt.Errorf("checkpoint: %w", err)
		}
	}
	return vm.ID, claim, nil
}

// forget drops an unprepared claim's entry (if still there). The caller
// holds d.mu.
func (d *Driver) forget(ctx context.Context, uid types.UID) error {
	e, ok := d.state.Entries[uid]
	if !ok {
		return nil
	}
	delete(d.state.Entries, uid)
	klog.FromContext(ctx).Info("unprepared claim", "claim", e.Namespace+"/"+e.Name, "vm", e.VMID)
	return d.state.save(d.statePath)
}

// HandleError logs background errors (slice publishing); none is fatal. A
// slice the API server stored without its consumable capacity (a cluster
// without DRAConsumableCapacity) is named as such: the scheduler would then
// give each device whole to one claim.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		klog.FromContext(ctx).Error(err, "the API server dropped fields of the ResourceSlice: tiervm's devices need consumable capacity (Kubernetes 1.36+, or the DRAConsumableCapacity feature gate on the API server and the scheduler)", "disabled", dropped.DisabledFeatures())
		return
	}
	klog.FromContext(ctx).Error(err, msg)
}

// findVM returns the entry's VM if the service still has the one the driver
// created: by name with a named service (and the same boot id, or a record
// carried over a restart), by id and worker pid otherwise (ids restart at
// vm-1 with the service).
func (d *Driver) findVM(ctx context.Context, host *tiervm.Host, e *Entry) (*tiervm.VM, bool) {
	id := e.VMID
	if id == "" {
		if !host.Named() {
			return nil, false
		}
		id = e.VMName
	}
	vm, err := d.svc.Get(ctx, id)
	if err != nil {
		return nil, false
	}
	if host.Named() {
		return vm, vm.Labels[LabelPrefix+"claim-uid"] == string(e.ClaimUID)
	}
	if vm.Image != e.Spec.Image || vm.MemBytes != e.Spec.Mem || vm.Fast.MinBytes != e.FastMin() {
		return nil, false
	}
	if e.VMPid != 0 && vm.PidOf() != 0 && vm.PidOf() != e.VMPid {
		return nil, false
	}
	return vm, true
}
