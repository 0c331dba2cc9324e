package driver

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

const mi = int64(1) << 20

func claim(node string, fast, slow int64, params string) *resourceapi.ResourceClaim {
	q := func(b int64) map[resourceapi.QualifiedName]resource.Quantity {
		return map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: *resource.NewQuantity(b, resource.BinarySI)}
	}
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-1-memory-abcde", Namespace: "default", UID: "0f0e0d0c-1111-2222-3333-444455556666"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "fast", Driver: DefaultDriverName, Pool: node, Device: FastDevice, ConsumedCapacity: q(fast)},
					{Request: "slow", Driver: DefaultDriverName, Pool: node, Device: SlowDevice, ConsumedCapacity: q(slow)},
					{Request: "gpu", Driver: "gpu.example.com", Pool: node, Device: "gpu-0"},
				},
			}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "vm-1", UID: "pod-uid"}},
		},
	}
	if params != "" {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: DefaultDriverName, Parameters: kruntime.RawExtension{Raw: []byte(params)},
			}},
		}}
	}
	return c
}

func testDriver(t *testing.T, objs ...kruntime.Object) *Driver {
	d, err := New(Config{NodeName: "node-a", StateDir: t.TempDir(), Defaults: VMConfig{Image: "memcheck", Mem: "1Gi"}},
		fake.NewClientset(objs...), tiervm.New("/nonexistent"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The claim's consumed capacities become fast.min and mem; the opaque
// configuration the rest; the pod's labels the VM's.
func TestSpecFromClaim(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vm-1", Namespace: "default", UID: "pod-uid", Labels: map[string]string{"app": "db"}}}
	d := testDriver(t, pod)
	spec, devs, err := d.specFor(context.Background(), claim("node-a", 768*mi, 1024*mi,
		`{"apiVersion":"memory.tiervm.dev/v1alpha1","kind":"VMConfig","image":"zipf","args":["rss=64M"],"policy":"nomad","fastMax":"900Mi","weight":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Fast.Min != 768*mi || spec.Mem != 1024*mi || spec.Fast.Max != 900*mi || spec.Fast.Weight != 2 {
		t.Fatalf("sizes: %+v %+v", spec, *spec.Fast)
	}
	if spec.Image != "zipf" || spec.Policy != "nomad" || len(spec.Args) != 1 {
		t.Fatalf("config: %+v", spec)
	}
	if len(devs) != 2 || devs[0].Device != FastDevice || devs[1].Device != SlowDevice {
		t.Fatalf("devices (only this driver's): %+v", devs)
	}
	want := map[string]string{
		"tiervm.dev/driver": DefaultDriverName, "tiervm.dev/node": "node-a", "tiervm.dev/pod": "default/vm-1",
		"tiervm.dev/claim": "default/vm-1-memory-abcde", "tiervm.dev/claim-uid": "0f0e0d0c-1111-2222-3333-444455556666", "pod/app": "db",
	}
	for k, v := range want {
		if spec.Labels[k] != v {
			t.Fatalf("label %s = %q, want %q (%v)", k, spec.Labels[k], v, spec.Labels)
		}
	}
	keyOK := regexp.MustCompile(`^[A-Za-z0-9._/-]{1,63}$`)
	for k := range spec.Labels {
		if !keyOK.MatchString(k) {
			t.Fatalf("label key %q is not one the service takes", k)
		}
	}
}

func TestSpecDefaultsAndErrors(t *testing.T) {
	d := testDriver(t)
	c := claim("node-a", 64*mi, 0, "")
	c.Status.Allocation.Devices.Results = c.Status.Allocation.Devices.Results[:1] // fast only
	spec, _, err := d.specFor(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mem != 1024*mi || spec.Image != "memcheck" {
		t.Fatalf("defaults: %+v", spec)
	}
	if _, _, err := d.specFor(context.Background(), claim("node-b", 64*mi, 64*mi, "")); err == nil || !strings.Contains(err.Error(), "not on node node-a") {
		t.Fatalf("a device of another node: %v", err)
	}
	if _, _, err := d.specFor(context.Background(), claim("node-a", 64*mi, 64*mi, `{"imagee":"zipf"}`)); err == nil {
		t.Fatal("an unknown configuration field must fail the prepare")
	}
	c = claim("node-a", 64*mi, 64*mi, "")
	c.Status.Allocation = nil
	if _, _, err := d.specFor(context.Background(), c); err == nil {
		t.Fatal("an unallocated claim must fail")
	}
}

func TestVMName(t *testing.T) {
	c := claim("node-a", 0, 0, "")
	c.Namespace, c.Name = "A-Very-Long-Namespace-Name", "and-an-even-longer-claim-name-for-a-vm"
	n := vmName(c)
	if len(n) > 63 || !regexp.MustCompile(`^[a-z0-9._-]+$`).MatchString(n) || !strings.HasSuffix(n, string(c.UID)) {
		t.Fatalf("vm name %q", n)
	}
	if strings.HasPrefix(n, "vm-") {
		t.Fatal("names of the form vm-N are the service's own ids")
	}
}

func TestDevicePolicy(t *testing.T) {
	p := tiervm.Pool{Tier: "fast", Node: 1}
	d := device(FastDevice, p, 512*mi, false, 0)
	c := d.Capacity[CapacityMemory]
	if c.Value.Value() != 512*mi || c.RequestPolicy == nil || c.RequestPolicy.ValidRange.Step.Value() != Step {
		t.Fatalf("%+v", c)
	}
	if *d.Attributes["numaNode"].IntValue != 1 || *d.Attributes["tier"].StringValue != "fast" || !*d.AllowMultipleAllocations {
		t.Fatalf("%+v", d.Attributes)
	}
	// A pool with less than one step: no range (min + step must fit).
	if d := device(SlowDevice, p, 0, false, 1<<30); d.Capacity[CapacityMemory].RequestPolicy != nil {
		t.Fatal("policy on an empty device")
	}
	// A default above the capacity is dropped to 0.
	if d := device(SlowDevice, p, 256*mi, false, 1<<30); d.Capacity[CapacityMemory].RequestPolicy.Default.Value() != 0 {
		t.Fatal("default above capacity")
	}
}

// The checkpoint survives a restart of the driver.
func TestCheckpointRoundTrip(t *testing.T) {
	dir := t.TempDir()
	d1, err := New(Config{NodeName: "n", StateDir: dir}, fake.NewClientset(), tiervm.New("/x"))
	if err != nil {
		t.Fatal(err)
	}
	d1.state.Entries["u"] = &Entry{ClaimUID: types.UID("u"), Namespace: "ns", Name: "c", Phase: PhasePrepared, VMID: "vm-7", VMPid: 42,
		Spec: tiervm.Spec{Image: "memcheck", Mem: 64 * mi, Fast: &tiervm.FastRequest{Min: 32 * mi}}}
	if err := d1.state.save(d1.statePath); err != nil {
		t.Fatal(err)
	}
	d2, err := New(Config{NodeName: "n", StateDir: dir}, fake.NewClientset(), tiervm.New("/x"))
	if err != nil {
		t.Fatal(err)
	}
	e := d2.state.Entries["u"]
	if e == nil || e.VMID != "vm-7" || e.VMPid != 42 || e.FastMin() != 32*mi {
		t.Fatalf("%+v", e)
	}
}

// The kubelet's calls wait for Run's first reconciliation (bounded by
// their context), and go ahead once it has ended, even when it failed (here
// the service is not there).
func TestKubeletCallsWaitForTheFirstRound(t *testing.T) {
	d := testDriver(t)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := d.PrepareResourceClaims(short, nil); err == nil || !strings.Contains(err.Error(), "first reconciliation") {
		t.Fatalf("a prepare before the first round: %v", err)
	}
	if _, err := d.UnprepareResourceClaims(short, nil); err == nil {
		t.Fatal("an unprepare before the first round went ahead")
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go d.Run(ctx)
	wait, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if _, err := d.PrepareResourceClaims(wait, nil); err != nil {
		t.Fatalf("a prepare after the first round: %v", err)
	}
	if _, err := d.UnprepareResourceClaims(wait, nil); err != nil {
		t.Fatalf("an unprepare after the first round: %v", err)
	}
}
