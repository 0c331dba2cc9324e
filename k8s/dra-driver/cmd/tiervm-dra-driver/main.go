// Command tiervm-dra-driver is tiervm's DRA driver for one Kubernetes node:
// its kubelet plugin prepares a ResourceClaim for fast memory by creating a
// VM through the node's `tiervm serve`, and it publishes the node's pools as
// a ResourceSlice (docs/scale-out.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"tiervm.local/k8s/dra-driver/pkg/driver"
	"tiervm.local/k8s/dra-driver/pkg/tiervm"
)

func main() {
	klog.InitFlags(nil)
	var (
		kubeconfig   = flag.String("kubeconfig", "", "kubeconfig (default: in-cluster)")
		nodeName     = flag.String("node-name", os.Getenv("NODE_NAME"), "this node's name")
		driverName   = flag.String("driver-name", driver.DefaultDriverName, "DRA driver name")
		socket       = flag.String("tiervm-socket", "/run/tiervm/api.sock", "the node's tiervm serve socket")
		pluginDir    = flag.String("plugin-dir", "", "kubelet plugin directory (default /var/lib/kubelet/plugins/DRIVER)")
		registrarDir = flag.String("registrar-dir", kubeletplugin.KubeletRegistryDir, "kubelet plugin registration directory")
		stateDir     = flag.String("state-dir", "", "checkpoint directory (default: the plugin directory)")
		interval     = flag.Duration("interval", 2*time.Second, "time between reconciliations (pools, VMs, claims)")
		image        = flag.String("default-image", "memcheck", "VM image when a claim's configuration names none")
		mem          = flag.String("default-mem", "1Gi", "VM memory when a claim requests no slow memory")
	)
	flag.Parse()
	if err := run(*kubeconfig, *nodeName, *driverName, *socket, *pluginDir, *registrarDir, *stateDir, *interval, *image, *mem); err != nil {
		fmt.Fprintln(os.Stderr, "tiervm-dra-driver:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, nodeName, driverName, socket, pluginDir, registrarDir, stateDir string, interval time.Duration, image, mem string) error {
	if nodeName == "" {
		return fmt.Errorf("--node-name (or NODE_NAME) is required")
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, driverName)
	}
	if stateDir == "" {
		stateDir = pluginDir
	}
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	logger := klog.Background().WithValues("node", nodeName)
	ctx = klog.NewContext(ctx, logger)

	d, err := driver.New(driver.Config{
		DriverName: driverName, NodeName: nodeName, StateDir: stateDir, Interval: interval,
		Defaults: driver.VMConfig{Image: image, Mem: mem},
	}, kube, tiervm.New(socket))
	if err != nil {
		return err
	}
	// The plugin registers at once; the kubelet's calls wait for Run's
	// first reconciliation (VMs the service lost while the driver was down
	// are back before anything is prepared). Registering only after it
	// kept the node unregistered for as long as that round's service calls
	// took: 34 s once, deleting an orphan VM.
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(registrarDir, 0o750); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(kube),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.DriverName(driverName),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrarDirectoryPath(registrarDir),
	)
	if err != nil {
		return err
	}
	d.SetHelper(helper)
	logger.Info("tiervm DRA driver started", "driver", driverName, "socket", socket, "plugin", pluginDir)
	d.Run(ctx)
	helper.Stop()
	return nil
}
