//! The compute-shader copy between GPU buffers (`shaders/copy.comp`): on discrete GPUs every
//! shader core reads and writes 16-byte vectors, near the memory's bandwidth, where
//! `vkCmdCopyBuffer` runs on the copy engines (on an NVIDIA H200 about a fifth of
//! cudaMemcpy's rate).
//!
//! The pipeline is made on a device's first shader copy and lives in its `Submitter`
//! (`super::transfer`), behind the device's mutex, until the device goes. A copy is planned
//! here ([`plan`]): the engine copies the bytes up to the first destination offset a descriptor
//! can start at and those after the last whole element, the shader the middle in one dispatch
//! per piece that a storage-buffer descriptor can cover (`maxStorageBufferRange`), each buffer
//! bound at an offset aligned to `minStorageBufferOffsetAlignment` at or below where the piece
//! starts, the rest of the way passed to the shader in push constants.

use std::io::Cursor;

use ash::vk;

use super::device::VulkanDevice;

/// The shader for ranges whose offsets are congruent mod 16: `uvec4` elements.
const VEC4_SPV: &[u8] = include_bytes!("shaders/copy_vec4.spv");
/// The shader for ranges whose offsets are congruent mod 4 only: `uint` elements.
const WORD_SPV: &[u8] = include_bytes!("shaders/copy_word.spv");

/// Invocations per workgroup (the shader's specialization constant 0), or the device's
/// limit where that is lower.
const LOCAL_SIZE: u32 = 256;
/// Elements each invocation moves per pass of the shader's main loop (its `UNROLL`).
const UNROLL: u64 = 1;
/// The most workgroups one dispatch runs, the shader's grid-stride loop covering the rest: the
/// least `maxComputeWorkGroupCount[0]` that Vulkan guarantees. Measured on the H200 (1 GiB
/// between DEVICE_LOCAL buffers, random bytes, against `cuMemcpyDtoD` in turns): 132 x 8
/// groups of 4 elements per pass reached 0.83x, as many groups as the copy needs (up to this
/// bound) 0.94-0.95x with 1, 2 or 4 elements per pass: the GPU keeps more memory accesses in
/// flight with more, shorter-lived workgroups than with fewer long ones.
pub(crate) const MAX_GROUPS: u32 = 65_535;
// The shader's indices stay in 32 bits: grid strides below 2^26 (and counts below 2^30).
const _: () = assert!(MAX_GROUPS as u64 * LOCAL_SIZE as u64 * UNROLL <= 1 << 26);
/// Descriptor sets in the pool, one per dispatch: a copy that needs more dispatches than this
/// (more than this many times `maxStorageBufferRange`) goes in several submissions.
pub(crate) const SETS_PER_SUBMIT: usize = 16;
/// No descriptor covers more than this many elements: the shader's indices stay in 32 bits.
const MAX_ELEMENTS: u64 = 1 << 30;

/// The element size of a shader copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Width {
    /// 16-byte `uvec4`s: source and destination offsets congruent mod 16.
    Vec4,
    /// 4-byte words: offsets congruent mod 4 only.
    Word,
}

impl Width {
    pub(crate) fn bytes(self) -> u64 {
        match self {
            Width::Vec4 => 16,
            Width::Word => 4,
        }
    }

    /// The widest element that a copy from byte `src` to byte `dst` can move (the head before
    /// the first aligned element goes by the engine): none when the offsets are not
    /// congruent mod 4.
    pub(crate) fn for_offsets(src: u64, dst: u64) -> Option<Width> {
        let apart = src.abs_diff(dst);
        [Width::Vec4, Width::Word].into_iter().find(|w| apart % w.bytes() == 0)
    }
}

/// What shapes a device's dispatches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Limits {
    /// `minStorageBufferOffsetAlignment`.
    pub(crate) offset_alignment: u64,
    /// `maxStorageBufferRange`.
    pub(crate) max_range: u64,
    /// [`MAX_GROUPS`], or `maxComputeWorkGroupCount[0]` where lower.
    pub(crate) max_groups: u32,
    /// [`LOCAL_SIZE`], or the device's workgroup size limit where lower.
    pub(crate) local_size: u32,
}

/// One dispatch: the ranges bound (byte offset and size in each buffer) and the shader's push
/// constants (first source element, first destination element, element count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dispatch {
    pub(crate) src_bind: u64,
    pub(crate) src_range: u64,
    pub(crate) dst_bind: u64,
    pub(crate) dst_range: u64,
    pub(crate) src_first: u32,
    pub(crate) dst_first: u32,
    pub(crate) count: u32,
    pub(crate) groups: u32,
}

/// How one copy is made: engine copies (source offset, destination offset, size) for the
/// unaligned ends, and dispatches of one width for the middle.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) engine: Vec<vk::BufferCopy>,
    pub(crate) width: Width,
    pub(crate) dispatches: Vec<Dispatch>,
}

impl Plan {
    /// Whether the engine's copies must finish before the dispatches run: where source and
    /// destination are one `VkBuffer` and a range the engine writes (reads) meets a range
    /// bound for the shader to read or write (write). Ranges of two buffers never meet: the
    /// shader's destination ranges hold only the bytes it writes.
    pub(crate) fn engine_first(&self, one_buffer: bool) -> bool {
        let meets = |a: u64, a_len: u64, b: u64, b_len: u64| a < b + b_len && b < a + a_len;
        one_buffer
            && self.engine.iter().any(|r| {
                self.dispatches.iter().any(|p| {
                    meets(r.dst_offset, r.size, p.src_bind, p.src_range)
                        || meets(r.dst_offset, r.size, p.dst_bind, p.dst_range)
                        || meets(r.src_offset, r.size, p.dst_bind, p.dst_range)
                })
            })
    }
}

/// Plans a copy of `len` bytes from byte `src` of one buffer to byte `dst` of another with
/// the shader; `None` where the shader moves nothing (offsets not congruent mod 4, or no
/// whole element between the ends): the engine makes that copy alone.
pub(crate) fn plan(src: u64, dst: u64, len: u64, limits: &Limits) -> Option<Plan> {
    let width = Width::for_offsets(src, dst)?;
    let e = width.bytes();
    // The engine copies up to where the destination is aligned for a descriptor, so that the
    // destination's descriptors cover exactly the bytes the shader writes, none of the
    // engine's (the source's start at or below the piece: reads only). The source is then
    // aligned to the element, being congruent to the destination mod `e`.
    let align = limits.offset_alignment.max(e);
    let head = ((align - dst % align) % align).min(len);
    let middle = (len - head) / e * e;
    if middle == 0 {
        return None;
    }
    let tail = len - head - middle;
    let mut engine = Vec::with_capacity(2);
    if head > 0 {
        engine.push(vk::BufferCopy { src_offset: src, dst_offset: dst, size: head });
    }
    if tail > 0 {
        let at = head + middle;
        engine.push(vk::BufferCopy { src_offset: src + at, dst_offset: dst + at, size: tail });
    }
    // A piece's source range starts up to `align - e` bytes before the piece. Whole MiB
    // where the range allows, so that the destination of every piece stays aligned.
    let room = limits.max_range.saturating_sub(align - e).min(MAX_ELEMENTS * e);
    let piece_max = if room >= 1 << 20 { room / (1 << 20) * (1 << 20) } else { room / align * align };
    if piece_max == 0 {
        return None;
    }
    let group_elements = limits.local_size as u64 * UNROLL;
    let (src, dst) = (src + head, dst + head);
    let mut dispatches = Vec::with_capacity(middle.div_ceil(piece_max) as usize);
    let mut done = 0;
    while done < middle {
        let n = (middle - done).min(piece_max);
        let (s, d) = (src + done, dst + done);
        let (s_bind, d_bind) = (s / align * align, d / align * align);
        let count = n / e;
        dispatches.push(Dispatch {
            src_bind: s_bind,
            src_range: s - s_bind + n,
            dst_bind: d_bind,
            dst_range: d - d_bind + n,
            src_first: ((s - s_bind) / e) as u32,
            dst_first: ((d - d_bind) / e) as u32,
            count: count as u32,
            groups: count.div_ceil(group_elements).clamp(1, limits.max_groups as u64) as u32,
        });
        done += n;
    }
    Some(Plan { engine, width, dispatches })
}

/// A device's copy pipelines (handles only: copied out of the submitter for recording).
#[derive(Clone, Copy)]
pub(crate) struct ShaderCopy {
    set_layout: vk::DescriptorSetLayout,
    pipeline_layout: vk::PipelineLayout,
    /// For [`Width::Vec4`] and [`Width::Word`].
    pipelines: [vk::Pipeline; 2],
    /// [`SETS_PER_SUBMIT`] sets, reset before each submission's sets are allocated.
    pool: vk::DescriptorPool,
    pub(crate) limits: Limits,
}

impl ShaderCopy {
    /// Makes the pipelines on `device`, or says why they cannot be made.
    pub(crate) fn new(device: &VulkanDevice) -> Result<Self, String> {
        let shared = &device.shared;
        // SAFETY: plain queries on the device's physical device.
        let (properties, families) = unsafe {
            (
                shared.instance.get_physical_device_properties(shared.physical),
                shared.instance.get_physical_device_queue_family_properties(shared.physical),
            )
        };
        let family = device.info().queue_family_index as usize;
        if !families.get(family).is_some_and(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE)) {
            return Err(format!("the queue lava-flow copies on (family {family}) cannot run compute shaders"));
        }
        let l = &properties.limits;
        let limits = Limits {
            offset_alignment: l.min_storage_buffer_offset_alignment.max(1),
            max_range: l.max_storage_buffer_range as u64,
            max_groups: MAX_GROUPS.min(l.max_compute_work_group_count[0]),
            local_size: LOCAL_SIZE.min(l.max_compute_work_group_size[0]).min(l.max_compute_work_group_invocations),
        };
        if limits.max_range < 1 << 20 || limits.max_groups == 0 || limits.local_size == 0 {
            return Err(format!(
                "its limits are too small for the copy shader (maxStorageBufferRange {}, \
                 maxComputeWorkGroupCount[0] {}, workgroup size {})",
                limits.max_range, limits.max_groups, limits.local_size
            ));
        }
        let mut made = ShaderCopy {
            set_layout: vk::DescriptorSetLayout::null(),
            pipeline_layout: vk::PipelineLayout::null(),
            pipelines: [vk::Pipeline::null(); 2],
            pool: vk::DescriptorPool::null(),
            limits,
        };
        // SAFETY: objects made on a live device; on failure `destroy` destroys those made
        // (destroying a null handle does nothing) before any was used.
        match unsafe { made.make(&shared.device) } {
            Ok(()) => Ok(made),
            Err(e) => {
                // SAFETY: as above; nothing was submitted with these objects.
                unsafe { made.destroy(&shared.device) };
                Err(e)
            }
        }
    }

    /// Makes the objects, filling in `self` as it goes.
    unsafe fn make(&mut self, d: &ash::Device) -> Result<(), String> {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            let err = |what: &'static str| move |r: vk::Result| format!("{what} failed: {r}");
            let bindings = [0, 1].map(|binding| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(binding)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            });
            self.set_layout = d
                .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
                .map_err(err("vkCreateDescriptorSetLayout"))?;
            let set_layouts = [self.set_layout];
            let push = [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).offset(0).size(12)];
            self.pipeline_layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts).push_constant_ranges(&push),
                    None,
                )
                .map_err(err("vkCreatePipelineLayout"))?;
            let pool_sizes = [vk::DescriptorPoolSize {
                ty: vk::DescriptorType::STORAGE_BUFFER,
                descriptor_count: 2 * SETS_PER_SUBMIT as u32,
            }];
            self.pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_SUBMIT as u32).pool_sizes(&pool_sizes),
                    None,
                )
                .map_err(err("vkCreateDescriptorPool"))?;

            let mut modules = [vk::ShaderModule::null(); 2];
            let made = (|| {
                for (module, spv) in modules.iter_mut().zip([VEC4_SPV, WORD_SPV]) {
                    let code = ash::util::read_spv(&mut Cursor::new(spv))
                        .map_err(|e| format!("reading the embedded SPIR-V: {e}"))?;
                    *module = d
                        .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&code), None)
                        .map_err(err("vkCreateShaderModule"))?;
                }
                let local_size = self.limits.local_size.to_ne_bytes();
                let entries = [vk::SpecializationMapEntry { constant_id: 0, offset: 0, size: 4 }];
                let specialization = vk::SpecializationInfo::default().map_entries(&entries).data(&local_size);
                let name = c"main";
                let infos = modules.map(|module| {
                    vk::ComputePipelineCreateInfo::default().layout(self.pipeline_layout).stage(
                        vk::PipelineShaderStageCreateInfo::default()
                            .stage(vk::ShaderStageFlags::COMPUTE)
                            .module(module)
                            .name(name)
                            .specialization_info(&specialization),
                    )
                });
                match d.create_compute_pipelines(vk::PipelineCache::null(), &infos, None) {
                    Ok(p) => {
                        self.pipelines.copy_from_slice(&p);
                        Ok(())
                    }
                    Err((p, r)) => {
                        for (slot, pipeline) in self.pipelines.iter_mut().zip(p) {
                            *slot = pipeline;
                        }
                        Err(err("vkCreateComputePipelines")(r))
                    }
                }
            })();
            for module in modules {
                d.destroy_shader_module(module, None);
            }
            made
        }
    }

    /// Destroys the objects; none may be in use.
    pub(crate) unsafe fn destroy(&mut self, d: &ash::Device) {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            for p in self.pipelines {
                d.destroy_pipeline(p, None);
            }
            d.destroy_descriptor_pool(self.pool, None);
            d.destroy_pipeline_layout(self.pipeline_layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            self.pipelines = [vk::Pipeline::null(); 2];
            self.pool = vk::DescriptorPool::null();
            self.pipeline_layout = vk::PipelineLayout::null();
            self.set_layout = vk::DescriptorSetLayout::null();
        }
    }

    /// Resets the pool and writes one descriptor set per dispatch (at most
    /// [`SETS_PER_SUBMIT`]) over `src` and `dst`.
    ///
    /// # Safety
    /// No submission that uses the pool's sets is pending; `src` and `dst` are live buffers of
    /// `d` with usage STORAGE_BUFFER, covering the dispatches' ranges.
    pub(crate) unsafe fn prepare(
        &self,
        d: &ash::Device,
        src: vk::Buffer,
        dst: vk::Buffer,
        dispatches: &[Dispatch],
    ) -> Result<Vec<vk::DescriptorSet>, vk::Result> {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            debug_assert!(dispatches.len() <= SETS_PER_SUBMIT);
            d.reset_descriptor_pool(self.pool, vk::DescriptorPoolResetFlags::empty())?;
            let layouts = vec![self.set_layout; dispatches.len()];
            let sets = d.allocate_descriptor_sets(
                &vk::DescriptorSetAllocateInfo::default().descriptor_pool(self.pool).set_layouts(&layouts),
            )?;
            let infos: Vec<[vk::DescriptorBufferInfo; 2]> = dispatches
                .iter()
                .map(|p| {
                    [
                        vk::DescriptorBufferInfo { buffer: src, offset: p.src_bind, range: p.src_range },
                        vk::DescriptorBufferInfo { buffer: dst, offset: p.dst_bind, range: p.dst_range },
                    ]
                })
                .collect();
            let writes: Vec<vk::WriteDescriptorSet> = sets
                .iter()
                .zip(&infos)
                .flat_map(|(&set, info)| {
                    (0..2).map(move |b| {
                        vk::WriteDescriptorSet::default()
                            .dst_set(set)
                            .dst_binding(b as u32)
                            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                            .buffer_info(std::slice::from_ref(&info[b]))
                    })
                })
                .collect();
            d.update_descriptor_sets(&writes, &[]);
            Ok(sets)
        }
    }

    /// Records the dispatches, with the sets [`ShaderCopy::prepare`] made for them.
    ///
    /// # Safety
    /// `cmd` is recording on a queue with compute; `sets` are from `prepare` for `dispatches`.
    pub(crate) unsafe fn record(
        &self,
        d: &ash::Device,
        cmd: vk::CommandBuffer,
        width: Width,
        dispatches: &[Dispatch],
        sets: &[vk::DescriptorSet],
    ) {
        // SAFETY: the caller keeps this function's contract (its doc comment), which is all that
        // the unsafe operations below rely on.
        unsafe {
            let pipeline = self.pipelines[match width {
                Width::Vec4 => 0,
                Width::Word => 1,
            }];
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            for (p, &set) in dispatches.iter().zip(sets) {
                d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, self.pipeline_layout, 0, &[set], &[]);
                let mut push = [0u8; 12];
                for (bytes, value) in push.chunks_exact_mut(4).zip([p.src_first, p.dst_first, p.count]) {
                    bytes.copy_from_slice(&value.to_ne_bytes());
                }
                d.cmd_push_constants(cmd, self.pipeline_layout, vk::ShaderStageFlags::COMPUTE, 0, &push);
                d.cmd_dispatch(cmd, p.groups, 1, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NVIDIA: Limits =
        Limits { offset_alignment: 16, max_range: u32::MAX as u64, max_groups: MAX_GROUPS, local_size: 256 };
    const SMALL: Limits = Limits { offset_alignment: 256, max_range: 1 << 20, max_groups: 4, local_size: 64 };

    /// Every byte of [src, src + len) lands at the same distance in dst, once, by the engine
    /// or by exactly one dispatch, within limits.
    fn check(src: u64, dst: u64, len: u64, limits: &Limits) -> Option<Plan> {
        let plan = plan(src, dst, len, limits)?;
        let e = plan.width.bytes();
        let mut covered: Vec<(u64, u64)> = plan
            .engine
            .iter()
            .map(|r| {
                assert_eq!(r.dst_offset - dst, r.src_offset - src);
                (r.src_offset, r.size)
            })
            .collect();
        for p in &plan.dispatches {
            assert_eq!(p.src_bind % limits.offset_alignment.max(e), 0, "{p:?}");
            assert_eq!(p.dst_bind % limits.offset_alignment.max(e), 0, "{p:?}");
            assert!(p.src_range <= limits.max_range && p.dst_range <= limits.max_range, "{p:?}");
            assert_eq!(p.src_range, (p.src_first as u64 + p.count as u64) * e);
            assert_eq!(p.dst_range, (p.dst_first as u64 + p.count as u64) * e);
            let s = p.src_bind + p.src_first as u64 * e;
            assert_eq!(p.dst_bind + p.dst_first as u64 * e - dst, s - src);
            assert!(p.groups >= 1 && p.groups <= limits.max_groups);
            assert_eq!(p.dst_first, 0, "the destination range holds only what the shader writes: {p:?}");
            assert!(!plan.engine_first(false));
            covered.push((s, p.count as u64 * e));
        }
        covered.sort();
        let mut at = src;
        for (start, size) in covered {
            assert_eq!(start, at);
            assert!(size > 0);
            at += size;
        }
        assert_eq!(at, src + len);
        Some(plan)
    }

    #[test]
    fn widths_follow_the_offsets() {
        assert_eq!(Width::for_offsets(32, 48), Some(Width::Vec4));
        assert_eq!(Width::for_offsets(3, 19), Some(Width::Vec4));
        assert_eq!(Width::for_offsets(3, 7), Some(Width::Word));
        assert_eq!(Width::for_offsets(8, 0), Some(Width::Word));
        assert_eq!(Width::for_offsets(1, 2), None);
    }

    #[test]
    fn plans_cover_every_byte_once() {
        for limits in [NVIDIA, SMALL] {
            for (src, dst) in [(0, 0), (16, 4096), (5, 21), (7, 3), (255, 1), (1, 2), (4096, 0)] {
                for len in [1, 3, 15, 16, 17, 64, 4095, 1 << 20, (1 << 20) + 3, (5 << 20) + 17] {
                    check(src, dst, len, &limits);
                }
            }
        }
    }

    #[test]
    fn plans_use_the_engine_where_the_shader_cannot() {
        assert!(plan(1, 2, 1 << 20, &NVIDIA).is_none(), "offsets not congruent mod 4");
        assert!(plan(1, 17, 15, &NVIDIA).is_none(), "no whole vector");
        let p = check(1, 17, 16 + 15 + 2, &NVIDIA).unwrap();
        assert_eq!(p.width, Width::Vec4);
        assert_eq!(p.engine.len(), 2);
        assert_eq!(p.dispatches.len(), 1);
        let p = check(0, 0, 1 << 20, &NVIDIA).unwrap();
        assert!(p.engine.is_empty());
        assert_eq!(p.dispatches[0].count, 1 << 16);
        let p = check(2, 6, 1 << 20, &NVIDIA).unwrap();
        assert_eq!(p.width, Width::Word);
    }

    #[test]
    fn engine_first_where_one_buffer_has_ranges_that_meet() {
        // Source 4 bytes after the destination, in one buffer: the engine writes the
        // destination's last 12 bytes, in the source's range, which starts 208 bytes early.
        let p = check(976, 0, 972, &SMALL).unwrap();
        assert_eq!(p.dispatches[0].src_bind, 768);
        assert!(p.engine_first(true));
        assert!(!p.engine_first(false));
        // Far apart: no.
        let p = check(1 << 20, 0, 4096 + 7, &NVIDIA).unwrap();
        assert!(!p.engine_first(true));
    }

    #[test]
    fn large_copies_are_split_by_the_descriptor_range() {
        let p = check(300, 44, (3 << 20) + 5, &SMALL).unwrap();
        assert_eq!(p.dispatches.len(), 4);
        assert!(p.dispatches.iter().all(|d| d.groups <= SMALL.max_groups));
        // 4095 MiB per descriptor where the range is 4 GiB - 1.
        let p = check(0, 0, 256 << 30, &NVIDIA).unwrap();
        assert_eq!(p.dispatches.len(), 65);
        assert!(p.dispatches.iter().all(|d| d.src_first == 0 && d.dst_first == 0));
    }
}
