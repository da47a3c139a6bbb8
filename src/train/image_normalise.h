// What 8-bit RGB becomes for training (an image folder's files, an .npz of uint8 images): x / 255
// normalised with ImageNet's mean and std per channel, as torchvision's Normalize after ToTensor.
#pragma once

namespace fusebox {

inline constexpr float kImageNetMean[3] = {0.485f, 0.456f, 0.406f};
inline constexpr float kImageNetStd[3] = {0.229f, 0.224f, 0.225f};

// Channel c (0, 1, 2: R, G, B) of value v in [0, 255].
inline float imagenet_normalised(int c, float v) {
  return (v / 255.f - kImageNetMean[c]) / kImageNetStd[c];
}

}  // namespace fusebox
