"""The training data layer ``roi_data_layer.layer.RoIDataLayer`` of the Faster R-CNN example."""
