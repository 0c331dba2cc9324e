#![no_std]
#![no_main]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! { loop {} }
#[no_mangle]
pub extern "C" fn _start() -> ! { unsafe { core::arch::asm!("out dx, eax", in("dx") 0x501u16, in("eax") 0u32); } loop {} }
