//! PNG files as 8-bit HWC [`Image`]s (the `png` crate decodes; this module
//! maps its colour types onto channels), for WebDataset samples.

use std::io::Cursor;
use std::path::Path;

use png::{ColorType, Decoder, Limits, Transformations};

use crate::{Error, Image, Result};

/// The most bytes a decoded image may take (PIL's decompression-bomb
/// limit is about 179 Mpixels; this is 256 MiB of pixels).
pub const MAX_DECODED_BYTES: usize = 256 << 20;

/// Decodes a PNG file to an 8-bit image: grayscale gives 1 channel, RGB
/// and palette images 3; an alpha channel is dropped (PIL's
/// `convert("L")` / `convert("RGB")` without compositing); 16-bit samples
/// keep their high byte, 1/2/4-bit ones are expanded to 0–255 as PIL does.
/// `path` only names the source in errors. Errors ([`Error::Format`]) on a
/// truncated or corrupt file, and on an image over [`MAX_DECODED_BYTES`].
pub fn decode_png(bytes: &[u8], path: &Path) -> Result<Image> {
    let bad = |msg: String| Error::Format {
        path: path.to_path_buf(),
        msg,
    };
    let mut decoder = Decoder::new_with_limits(
        Cursor::new(bytes),
        Limits {
            bytes: MAX_DECODED_BYTES,
        },
    );
    decoder.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(|e| bad(format!("PNG header: {e}")))?;
    let size = reader.output_buffer_size();
    if size > MAX_DECODED_BYTES {
        let info = reader.info();
        return Err(bad(format!(
            "PNG image {}×{} needs {size} bytes decoded, over the {MAX_DECODED_BYTES}-byte limit",
            info.width, info.height
        )));
    }
    let mut buf = vec![0u8; size];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| bad(format!("PNG data: {e}")))?;
    buf.truncate(frame.buffer_size());
    let (h, w) = (frame.height as usize, frame.width as usize);
    let (stored, keep) = match frame.color_type {
        ColorType::Grayscale => (1, 1),
        ColorType::GrayscaleAlpha => (2, 1),
        ColorType::Rgb => (3, 3),
        ColorType::Rgba => (4, 3),
        ColorType::Indexed => {
            return Err(bad("PNG palette was not expanded".into()));
        }
    };
    if stored != keep {
        buf = buf
            .chunks_exact(stored)
            .flat_map(|px| px[..keep].iter().copied())
            .collect();
    }
    Image::new(h, w, keep, buf).map_err(|e| bad(format!("PNG image {h}×{w}×{keep}: {e}")))
}

/// Encodes an 8-bit image as PNG (1 channel: grayscale, 2: grayscale and
/// alpha, 3: RGB, 4: RGBA), e.g. to write WebDataset shards that
/// [`decode_png`] reads back unchanged (for 1 and 3 channels). Errors on
/// another channel count or a side over `u32::MAX`.
pub fn encode_png(image: &Image) -> Result<Vec<u8>> {
    let color = match image.channels() {
        1 => ColorType::Grayscale,
        2 => ColorType::GrayscaleAlpha,
        3 => ColorType::Rgb,
        4 => ColorType::Rgba,
        c => {
            return Err(Error::arg(
                "encode_png",
                format!("{c} channels; PNG stores 1 to 4"),
            ))
        }
    };
    let side = |n: usize| {
        u32::try_from(n).map_err(|_| Error::arg("encode_png", format!("side {n} exceeds PNG's u32")))
    };
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, side(image.width())?, side(image.height())?);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    let fail = |e: png::EncodingError| Error::arg("encode_png", e.to_string());
    let mut writer = encoder.write_header().map_err(fail)?;
    writer.write_image_data(image.data()).map_err(fail)?;
    writer.finish().map_err(fail)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(w: u32, h: u32, color: ColorType, depth: png::BitDepth, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        if color == ColorType::Indexed {
            enc.set_palette(vec![0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255]);
        }
        let mut writer = enc.write_header().unwrap();
        writer.write_image_data(data).unwrap();
        writer.finish().unwrap();
        out
    }

    #[test]
    fn every_color_type_decodes_to_the_written_pixels() {
        let p = Path::new("x.png");
        let gray: Vec<u8> = (0..12).map(|i| i * 20).collect();
        let im = decode_png(
            &encode(4, 3, ColorType::Grayscale, png::BitDepth::Eight, &gray),
            p,
        )
        .unwrap();
        assert_eq!((im.shape(), im.data()), ([3, 4, 1], gray.as_slice()));

        let rgb: Vec<u8> = (0..18).map(|i| 255 - i * 7).collect();
        let im = decode_png(&encode(3, 2, ColorType::Rgb, png::BitDepth::Eight, &rgb), p).unwrap();
        assert_eq!((im.shape(), im.data()), ([2, 3, 3], rgb.as_slice()));

        let rgba: Vec<u8> = (0..8).map(|i| i * 30).collect();
        let im = decode_png(&encode(2, 1, ColorType::Rgba, png::BitDepth::Eight, &rgba), p).unwrap();
        assert_eq!(im.data(), &[0, 30, 60, 120, 150, 180], "alpha dropped");

        let ga = [10, 255, 20, 0];
        let im = decode_png(
            &encode(2, 1, ColorType::GrayscaleAlpha, png::BitDepth::Eight, &ga),
            p,
        )
        .unwrap();
        assert_eq!((im.shape(), im.data()), ([1, 2, 1], &[10u8, 20][..]));

        // 16-bit keeps the high byte; 1-bit expands to 0/255; a palette to RGB.
        let im = decode_png(
            &encode(
                2,
                1,
                ColorType::Grayscale,
                png::BitDepth::Sixteen,
                &[0x12, 0x34, 0xff, 0x00],
            ),
            p,
        )
        .unwrap();
        assert_eq!(im.data(), &[0x12, 0xff]);
        let im = decode_png(
            &encode(3, 1, ColorType::Grayscale, png::BitDepth::One, &[0b1010_0000]),
            p,
        )
        .unwrap();
        assert_eq!(im.data(), &[255, 0, 255]);
        let im = decode_png(
            &encode(3, 1, ColorType::Indexed, png::BitDepth::Eight, &[1, 2, 3]),
            p,
        )
        .unwrap();
        assert_eq!(
            (im.shape(), im.data()),
            ([1, 3, 3], &[255, 0, 0, 0, 255, 0, 0, 0, 255][..])
        );
    }

    #[test]
    fn encoded_images_decode_unchanged() {
        for c in [1, 3] {
            let im = Image::new(5, 7, c, (0..35 * c).map(|i| (i * 37 % 256) as u8).collect()).unwrap();
            assert_eq!(
                decode_png(&encode_png(&im).unwrap(), Path::new("r.png")).unwrap(),
                im
            );
        }
        assert!(encode_png(&Image::filled(2, 2, 5, 0)).is_err());
    }

    #[test]
    fn truncated_and_corrupt_files_are_errors_naming_the_file() {
        let p = Path::new("shard-000.tar:7.png");
        let good = encode(4, 4, ColorType::Grayscale, png::BitDepth::Eight, &[7; 16]);
        for cut in [0, 8, 20, good.len() / 2, good.len() - 13] {
            let e = decode_png(&good[..cut], p).unwrap_err().to_string();
            assert!(
                e.contains("shard-000.tar:7.png") && e.contains("PNG"),
                "{cut}: {e}"
            );
        }
        let mut flipped = good.clone();
        let at = flipped.len() - 20;
        flipped[at] ^= 0xff;
        assert!(decode_png(&flipped, p).is_err());
        assert!(decode_png(b"not a png at all", p).is_err());

        // A header claiming 100000 × 100000 RGB pixels is refused before
        // anything that size is allocated.
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&[0, 1, 0x86, 0xa0, 0, 1, 0x86, 0xa0]);
        huge[25] = 2;
        let crc = crc32fast::hash(&huge[12..29]);
        huge[29..33].copy_from_slice(&crc.to_be_bytes());
        let e = decode_png(&huge, p).unwrap_err().to_string();
        assert!(e.contains("PNG"), "{e}");
    }
}
