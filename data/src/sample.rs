//! Per-sample value types that collate cheaply: [`Image`] (u8, HWC) and
//! [`Array`] (any element type, any shape), both plain `Vec`s, so a worker
//! builds a sample without allocating a tensor for it.

use tessera_tensor::Element;

use crate::{Error, Result};

/// An 8-bit image stored height × width × channels, channels interleaved
/// (HWC, the layout of PIL and of decoded files). The geometric and colour
/// transforms in [`crate::transforms`] work on this type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    height: usize,
    width: usize,
    channels: usize,
    data: Vec<u8>,
}

impl Image {
    /// An image over `data` (HWC); errors when `data.len() != h·w·c`.
    pub fn new(height: usize, width: usize, channels: usize, data: Vec<u8>) -> Result<Self> {
        let want = height.checked_mul(width).and_then(|n| n.checked_mul(channels));
        if want != Some(data.len()) {
            return Err(Error::arg(
                "Image::new",
                format!(
                    "{} bytes do not fill a {height}x{width}x{channels} image",
                    data.len()
                ),
            ));
        }
        Ok(Image {
            height,
            width,
            channels,
            data,
        })
    }

    /// An image filled with `value`.
    pub fn filled(height: usize, width: usize, channels: usize, value: u8) -> Self {
        Image {
            height,
            width,
            channels,
            data: vec![value; height * width * channels],
        }
    }

    /// An image from planar (CHW) bytes, as CIFAR stores them; errors when
    /// the length is not `c·h·w`.
    pub fn from_chw(height: usize, width: usize, channels: usize, planes: &[u8]) -> Result<Self> {
        let hw = height * width;
        if planes.len() != hw * channels {
            return Err(Error::arg(
                "Image::from_chw",
                format!(
                    "{} bytes do not fill a {channels}x{height}x{width} image",
                    planes.len()
                ),
            ));
        }
        let mut data = vec![0u8; planes.len()];
        for c in 0..channels {
            for (p, &v) in planes[c * hw..(c + 1) * hw].iter().enumerate() {
                data[p * channels + c] = v;
            }
        }
        Ok(Image {
            height,
            width,
            channels,
            data,
        })
    }

    /// The height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The number of channels (1 grey, 3 RGB).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// `[height, width, channels]`.
    pub fn shape(&self) -> [usize; 3] {
        [self.height, self.width, self.channels]
    }

    /// The pixels, HWC.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The pixels, HWC, mutable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// The pixel buffer (HWC).
    pub fn into_data(self) -> Vec<u8> {
        self.data
    }

    /// Channel `c` of pixel `(y, x)`; the caller keeps the coordinates in range.
    #[inline]
    pub fn at(&self, y: usize, x: usize, c: usize) -> u8 {
        self.data[(y * self.width + x) * self.channels + c]
    }

    /// The pixels in planar CHW order (what models take).
    pub fn to_chw(&self) -> Vec<u8> {
        let hw = self.height * self.width;
        let mut out = vec![0u8; self.data.len()];
        for (p, px) in self.data.chunks_exact(self.channels.max(1)).enumerate() {
            for (c, &v) in px.iter().enumerate() {
                out[c * hw + p] = v;
            }
        }
        out
    }

    /// CHW `f32` values scaled to `[0, 1]` (torchvision's `ToTensor`).
    pub fn to_chw_f32(&self) -> Array<f32> {
        let data = self.to_chw().into_iter().map(|v| v as f32 / 255.0).collect();
        Array {
            shape: vec![self.channels, self.height, self.width],
            data,
        }
    }
}

/// An n-d array of one element type, row-major: a sample field before
/// collation (a label vector, a CHW float image, an embedding).
#[derive(Debug, Clone, PartialEq)]
pub struct Array<T> {
    /// The sizes of the dimensions.
    pub shape: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<T>,
}

impl<T: Element> Array<T> {
    /// An array of `shape` over `data`; errors when the counts differ.
    pub fn new(shape: Vec<usize>, data: Vec<T>) -> Result<Self> {
        let want = shape.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        if want != Some(data.len()) {
            return Err(Error::arg(
                "Array::new",
                format!("{} elements do not fill shape {shape:?}", data.len()),
            ));
        }
        Ok(Array { shape, data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chw_round_trip() {
        let planes: Vec<u8> = (0..24).collect();
        let img = Image::from_chw(2, 4, 3, &planes).unwrap();
        assert_eq!(img.at(1, 2, 1), planes[8 + 4 + 2]);
        assert_eq!(img.to_chw(), planes);
        assert!(Image::new(2, 2, 3, vec![0; 11]).is_err());
        assert!(Array::new(vec![2, 3], vec![0f32; 5]).is_err());
    }
}
