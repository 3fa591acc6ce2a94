"""Fast R-CNN helpers of the example: configuration, box transforms, NMS dispatch."""
