package driver

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

// Reconcile makes the service, the checkpoint and the API server agree:
//   - a claim the driver prepared that is gone from the API server (deleted,
//     replaced by another of the same name, or allocated elsewhere) has its
//     VM deleted: no VM without a claim;
//   - an unpreparing claim (the kubelet's unprepare has begun) has its VM
//     stopped and, once the VM is gone, its entry dropped; it never gets a
//     VM again. None of this waits for a VM to end: each round takes one
//     step, so a VM slow to stop never holds the loop (or the lock);
//   - a prepared claim whose VM the service no longer has (the service
//     restarted: its VMs stop with it) gets its VM created again with the
//     same spec: no claim without its VM;
//   - with a named service, a VM labelled as this driver's on this node that
//     no entry knows (a driver that died between the create and its
//     checkpoint) is deleted;
//   - the ResourceSlice follows the pools (GET /v1/host).
//
// A service that does not answer changes nothing: the slice keeps its last
// capacity and entries wait for the service to come back.
func (d *Driver) Reconcile(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// The host is read under the lock: a snapshot taken while a prepare or
	// unprepare held it would not match the entries, and the slice would
	// count the claim's VM as one made outside Kubernetes, or the reverse.
	d.mu.Lock()
	defer d.mu.Unlock()
	host, err := d.svc.Host(ctx)
	d.lastHost = host
	if err != nil {
		return fmt.Errorf("node %s: tiervm service unavailable: %w", d.cfg.NodeName, err)
	}
	changed := false
	for uid, e := range d.state.Entries {
		if e.Phase == PhaseUnpreparing {
			changed = d.finishUnprepare(ctx, host, uid, e) || changed
			continue
		}
		gone, why, err := d.claimGone(ctx, e)
		if err != nil {
			logger.Error(err, "claim lookup", "claim", e.Namespace+"/"+e.Name)
			continue
		}
		vm, found := d.findVM(ctx, host, e)
		if gone {
			logger.Info("claim gone: deleting its VM", "claim", e.Namespace+"/"+e.Name, "why", why, "vm", e.VMID, "found", found)
			e.Phase = PhaseUnpreparing
			d.finishUnprepare(ctx, host, uid, e)
			changed = true
			continue
		}
		if found && (vm.Alive() || vm.State == "stopping") {
			// A VM now running that a prepare still waits for, or one
			// recreated (below) that was still starting: record it.
			if (e.Phase != PhasePrepared || (e.VMPid == 0 && vm.PidOf() != 0)) && vm.State == "running" {
				e.Phase, e.VMPid = PhasePrepared, vm.PidOf()
				changed = true
			}
			continue
		}
		if e.Phase != PhasePrepared {
			// A prepare that did not finish: the kubelet retries it
			// (it did not get a success), so leave the VM to that.
			if found && vm.Ended() {
				_ = d.svc.Remove(ctx, vm.ID)
			}
			delete(d.state.Entries, uid)
			changed = true
			continue
		}
		// Prepared, and the service lost the VM: create it again. The
		// round does not wait for it to run (a later round records its
		// pid, or creates it again if it ended instead).
		if found {
			_ = d.svc.Remove(ctx, vm.ID)
		}
		old := e.VMID
		e.VMPid = 0
		if err := d.startVM(ctx, host, e); err != nil {
			logger.Error(err, "recreate VM", "claim", e.Namespace+"/"+e.Name)
			changed = true
			continue
		}
		e.Recreated++
		changed = true
		logger.Info("VM recreated for prepared claim", "claim", e.Namespace+"/"+e.Name, "old", old, "vm", e.VMID)
	}
	if host.Named() {
		d.collectOrphans(ctx)
	}
	if changed {
		if err := d.state.save(d.statePath); err != nil {
			return err
		}
	}
	return d.publish(ctx, host)
}

// finishUnprepare takes one step towards the end of an unpreparing entry
// (see stepRemove); once its VM is gone the entry is too, and the kubelet's
// next unprepare of it succeeds at once. Never creates the VM again.
// Reports whether the entry changed. The caller holds d.mu.
func (d *Driver) finishUnprepare(ctx context.Context, host *tiervm.Host, uid types.UID, e *Entry) bool {
	if vm, found := d.findVM(ctx, host, e); found {
		gone, err := d.stepRemove(ctx, vm)
		if err != nil {
			klog.FromContext(ctx).Error(err, "delete the VM of an unpreparing claim", "claim", e.Namespace+"/"+e.Name, "vm", vm.ID)
		}
		if !gone {
			return false
		}
	}
	delete(d.state.Entries, uid)
	klog.FromContext(ctx).Info("unprepared claim: its VM is gone", "claim", e.Namespace+"/"+e.Name, "vm", e.VMID)
	return true
}

// stepRemove takes one step, without waiting, towards a VM's removal: a
// VM still alive is asked to stop, an ended one's record is removed, a
// stopping one is left to end. Reports whether the VM is gone.
func (d *Driver) stepRemove(ctx context.Context, vm *tiervm.VM) (bool, error) {
	switch {
	case vm.Alive():
		return false, d.svc.Delete(ctx, vm.ID)
	case !vm.Ended():
		return false, nil
	}
	if err := d.svc.Delete(ctx, vm.ID); err != nil { // a VM already gone is no error
		return false, err
	}
	return true, nil
}

// claimGone says whether the entry's claim no longer needs a VM here.
func (d *Driver) claimGone(ctx context.Context, e *Entry) (bool, string, error) {
	claim, err := d.kube.ResourceV1().ResourceClaims(e.Namespace).Get(ctx, e.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, "deleted", nil
	}
	if err != nil {
		return false, "", err
	}
	if claim.UID != e.ClaimUID {
		return true, "replaced", nil
	}
	if claim.Status.Allocation == nil {
		return true, "deallocated", nil
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == d.cfg.DriverName && r.Pool != d.cfg.NodeName {
			return true, "allocated on " + r.Pool, nil
		}
	}
	return false, "", nil
}

// collectOrphans deletes VMs labelled as this driver's on this node that no
// entry knows, a step per round (stepRemove).
func (d *Driver) collectOrphans(ctx context.Context) {
	vms, err := d.svc.List(ctx)
	if err != nil {
		return
	}
	known := map[string]bool{}
	for _, e := range d.state.Entries {
		known[e.VMName] = true
		known[e.VMID] = true
	}
	for _, vm := range vms {
		if vm.Labels[LabelPrefix+"driver"] != d.cfg.DriverName || vm.Labels[LabelPrefix+"node"] != d.cfg.NodeName {
			continue
		}
		if known[vm.ID] {
			continue
		}
		gone, err := d.stepRemove(ctx, &vm)
		switch {
		case err != nil:
			klog.FromContext(ctx).Error(err, "delete orphan VM", "vm", vm.ID)
		case gone:
			klog.FromContext(ctx).Info("orphan VM deleted", "vm", vm.ID, "claim", vm.Labels[LabelPrefix+"claim"])
		}
	}
}

// ours sums the fast mins and mems of the entries the service holds
// (prepared or being created).
func (d *Driver) ours() (fast, slow int64) {
	for _, e := range d.state.Entries {
		// An unpreparing entry's VM was asked to stop (or is about to be):
		// the service released its reservation then.
		if e.VMID == "" || e.Phase == PhaseUnpreparing {
			continue
		}
		fast += e.FastMin()
		slow += e.Spec.Mem
	}
	return
}

// publish keeps the node's ResourceSlice current. Each device's capacity is
// the pool's capacity less what VMs outside Kubernetes reserve on it (the
// scheduler accounts for the claims' own share).
func (d *Driver) publish(ctx context.Context, host *tiervm.Host) error {
	if d.helper == nil {
		return nil
	}
	fast, okf := host.Pool("fast")
	slow, oks := host.Pool("slow")
	if !okf || !oks {
		return fmt.Errorf("GET /v1/host has no fast or slow pool")
	}
	ourFast, ourSlow := d.ours()
	capFast := fast.CapacityBytes - max(0, fast.ReservedBytes-ourFast)
	capSlow := slow.CapacityBytes - max(0, slow.ReservedBytes-ourSlow)
	capFast, capSlow = max(0, capFast/Step*Step), max(0, capSlow/Step*Step)
	attrs := fmt.Sprintf("%d/%d/%v", fast.Node, slow.Node, host.Emulated)
	if d.published == [2]int64{capFast, capSlow} && d.attrs == attrs {
		return nil
	}
	devices := []resourceapi.Device{
		device(FastDevice, fast, capFast, host.Emulated, 0),
		device(SlowDevice, slow, capSlow, host.Emulated, 1<<30),
	}
	err := d.helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			d.cfg.NodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	})
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("ResourceSlice published", "fast", capFast, "slow", capSlow, "fastReservedOutside", fast.ReservedBytes-ourFast)
	d.published, d.attrs = [2]int64{capFast, capSlow}, attrs
	return nil
}

func device(name string, pool tiervm.Pool, capacity int64, emulated bool, dflt int64) resourceapi.Device {
	step := resource.NewQuantity(Step, resource.BinarySI)
	zero := resource.NewQuantity(0, resource.BinarySI)
	if dflt > capacity {
		dflt = 0
	}
	policy := &resourceapi.CapacityRequestPolicy{
		Default:    resource.NewQuantity(dflt, resource.BinarySI),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: zero, Step: step},
	}
	if capacity < Step {
		policy = nil // a range needs min + step within the capacity
	}
	return resourceapi.Device{
		Name:                     name,
		AllowMultipleAllocations: ptr.To(true),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"tier":     {StringValue: ptr.To(pool.Tier)},
			"numaNode": {IntValue: ptr.To(int64(pool.Node))},
			"emulated": {BoolValue: ptr.To(emulated)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityMemory: {
				Value:         *resource.NewQuantity(capacity, resource.BinarySI),
				RequestPolicy: policy,
			},
		},
	}
}

// Snapshot is what the driver holds, for tests and debugging.
func (d *Driver) Snapshot() map[types.UID]Entry {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]Entry{}
	for k, v := range d.state.Entries {
		out[k] = *v
	}
	return out
}
