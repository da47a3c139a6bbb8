// placeholder so the layer has a source; the helper owning this folder deletes it
