// SPDX-License-Identifier: GPL-2.0
/*
 * nv_stub.c - module "nvidia": a test stand-in for NVIDIA's RM driver node set, for
 * uvmwatch's VM tests. Not a driver: there is no GPU behind it.
 *
 * Registers char major 195 as NVIDIA's driver does (/proc/devices: "195 nvidia"), so that
 * /dev/nvidiactl (195:255) and /dev/nvidia<N> (195:N, N < num_gpus) can be opened, and
 * answers the RM escapes (_IOWR('F', nr, size)) the way a healthy driver would: the params
 * are copied in and out, every NV_STATUS field cuInit reads is NV_OK. The device nodes are
 * made by the test's /init with mknod, as nvidia-modprobe does on a real host.
 *
 * Also publishes /proc/driver/nvidia/version (with a "uvmwatch vmtest stub" marker) and
 * /proc/driver/nvidia/params, which libcuda and `uvmwatch doctor` read.
 */
#include <linux/module.h>
#include <linux/fs.h>
#include <linux/uaccess.h>
#include <linux/slab.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/ioctl.h>

#define NV_MAJOR 195
#define NV_CTL_MINOR 255
#define NV_IOCTL_MAGIC 'F'
#define NV_MAX_PARAMS 4096

/* RM escapes (nv_escape.h, nv-ioctl-numbers.h) and the offset of their NV_STATUS. */
#define NV_ESC_RM_FREE 0x29          /* NVOS00, 16 bytes, status @12 */
#define NV_ESC_RM_CONTROL 0x2A       /* NVOS54, 32 bytes, status @28 */
#define NV_ESC_RM_ALLOC 0x2B         /* NVOS64, 48 bytes, status @40 */
#define NV_ESC_CARD_INFO 0xC8
#define NV_ESC_CHECK_VERSION_STR 0xD2 /* nv_ioctl_rm_api_version_t: cmd @0, reply @4 */
#define NV_RM_API_VERSION_REPLY_RECOGNIZED 1

static int num_gpus = 1;
module_param(num_gpus, int, 0444);
MODULE_PARM_DESC(num_gpus, "number of /dev/nvidia<N> minors that open (default 1)");

static atomic_t ioctl_count = ATOMIC_INIT(0);

static int nv_open(struct inode *inode, struct file *filp)
{
	unsigned int minor = iminor(inode);

	if (minor == NV_CTL_MINOR || (int)minor < num_gpus)
		return 0;
	return -ENODEV;
}

static int nv_release(struct inode *inode, struct file *filp)
{
	return 0;
}

static void put_status(u8 *p, size_t size, size_t off)
{
	if (off + 4 <= size)
		memset(p + off, 0, 4); /* NV_OK */
}

static noinline long nvidia_unlocked_ioctl(struct file *filp, unsigned int cmd,
					   unsigned long arg)
{
	size_t size = _IOC_SIZE(cmd);
	unsigned int nr = _IOC_NR(cmd);
	void __user *uarg = (void __user *)arg;
	u8 *p;

	if (_IOC_TYPE(cmd) != NV_IOCTL_MAGIC)
		return -ENOTTY;
	atomic_inc(&ioctl_count);
	if (size == 0)
		return 0;
	if (size > NV_MAX_PARAMS)
		return -EINVAL;
	p = kzalloc(size, GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	if (copy_from_user(p, uarg, size)) {
		kfree(p);
		return -EFAULT;
	}
	switch (nr) {
	case NV_ESC_RM_FREE:
		put_status(p, size, 12);
		break;
	case NV_ESC_RM_CONTROL:
		put_status(p, size, 28);
		break;
	case NV_ESC_RM_ALLOC:
		put_status(p, size, 40);
		break;
	case NV_ESC_CHECK_VERSION_STR:
		if (size >= 8) {
			u32 reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;

			memcpy(p + 4, &reply, sizeof(reply));
		}
		break;
	default:
		break;
	}
	if (copy_to_user(uarg, p, size)) {
		kfree(p);
		return -EFAULT;
	}
	kfree(p);
	return 0;
}

static const struct file_operations nv_fops = {
	.owner = THIS_MODULE,
	.open = nv_open,
	.release = nv_release,
	.unlocked_ioctl = nvidia_unlocked_ioctl,
	.compat_ioctl = nvidia_unlocked_ioctl,
};

static int version_show(struct seq_file *m, void *v)
{
	seq_puts(m, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.48.01  "
		    "Release Build  (uvmwatch vmtest stub, no GPU)\n");
	seq_puts(m, "GCC version:  (uvmwatch vmtest stub)\n");
	return 0;
}

static int params_show(struct seq_file *m, void *v)
{
	seq_puts(m, "ResmanDebugLevel: 4294967295\n");
	seq_puts(m, "ModifyDeviceFiles: 1\n");
	seq_puts(m, "DeviceFileUID: 0\n");
	seq_puts(m, "DeviceFileGID: 0\n");
	seq_puts(m, "DeviceFileMode: 438\n");
	seq_printf(m, "vmtest_ioctls: %d\n", atomic_read(&ioctl_count));
	return 0;
}

static struct proc_dir_entry *proc_dir;

static int __init nv_stub_init(void)
{
	int ret = register_chrdev(NV_MAJOR, "nvidia", &nv_fops);

	if (ret < 0) {
		pr_err("nvidia (vmtest stub): register_chrdev(195) failed: %d\n", ret);
		return ret;
	}
	proc_dir = proc_mkdir("driver/nvidia", NULL);
	if (proc_dir) {
		proc_create_single("version", 0444, proc_dir, version_show);
		proc_create_single("params", 0444, proc_dir, params_show);
	}
	pr_info("nvidia (vmtest stub): major 195, %d GPU node(s), no hardware\n", num_gpus);
	return 0;
}

static void __exit nv_stub_exit(void)
{
	if (proc_dir)
		proc_remove(proc_dir);
	unregister_chrdev(NV_MAJOR, "nvidia");
}

module_init(nv_stub_init);
module_exit(nv_stub_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("uvmwatch vmtest: stand-in for the NVIDIA RM driver's device nodes (no GPU)");
